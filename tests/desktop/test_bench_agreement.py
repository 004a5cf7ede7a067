"""One machine, one set of figures (issue 37): `gpuflex-node bench` and the tray's first-run
wizard measured fp32 0.00277 and 0.00061 TFLOP/s on the same computer, because the quick run
timed smaller matrices fewer times. A cached `bench --quick` still said "benchmarking…", and
`gpuflex-node run` logged every heartbeat at INFO."""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
from pathlib import Path

import httpx
import pytest
import torch

from desktop import benchmark as bm
from desktop import probe as probe_mod
from desktop.bench_result import BenchmarkResult
from desktop.cli import main, quiet_routine_requests
from desktop.hardware import HardwareReport

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recorded_matmuls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every matmul the benchmark times (device, dtype, size, repetitions), at a fixed rate;
    the memory, transfer and training parts stubbed: this is about what is measured."""
    calls: list[tuple] = []

    def matmul(device, dtype, n, reps):
        calls.append((device.type, dtype, n, reps))
        return 0.001 * n / 256

    monkeypatch.setattr(bm, "matmul_tflops", matmul)
    monkeypatch.setattr(bm, "memory_gbps", lambda *a: 10.0)
    monkeypatch.setattr(bm, "transfer_gbps", lambda *a: None)
    monkeypatch.setattr(bm, "train_throughput", lambda *a: 100.0)
    return calls


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_quick_and_full_runs_time_the_same_matmuls(
    recorded_matmuls: list[tuple], hardware: HardwareReport, monkeypatch, device: str
) -> None:
    monkeypatch.setattr("trainer.device.best_device", lambda d=None: torch.device(device))
    quick = bm.run_benchmark(hardware, quick=True)
    quick_calls = list(recorded_matmuls)
    recorded_matmuls.clear()
    full = bm.run_benchmark(hardware, quick=False)
    assert quick_calls == recorded_matmuls  # same sizes, same repetitions, same warm-up
    assert quick.matmul_tflops == full.matmul_tflops
    assert quick.advertised()["fp32_tflops"] == full.advertised()["fp32_tflops"]
    assert quick.quick and not full.quick  # --quick still saves time elsewhere


def test_the_wizard_and_the_cli_measure_through_one_function(
    monkeypatch: pytest.MonkeyPatch, fake_bench: BenchmarkResult, tmp_path: Path
) -> None:
    """The wizard measures through desktop.probe's child (quick), the CLI in its own process:
    both run desktop.benchmark.benchmark, so both run run_benchmark's one matmul_figures."""
    seen: list[bool] = []

    def benchmark(hw, cache_dir, quick=False, force=False):
        seen.append(quick)
        return dataclasses.replace(fake_bench, quick=quick), False

    monkeypatch.setattr(bm, "benchmark", benchmark)
    assert main(["bench", "--json"]) == 0  # gpuflex-node bench
    assert probe_mod.main([str(tmp_path)]) == 0  # what the wizard's probe() runs, quick
    assert seen == [False, True]
    wizard = ast.parse((ROOT / "desktop/gui/first_run.py").read_text(encoding="utf-8"))
    probes = [
        n for n in ast.walk(wizard)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "probe"
    ]  # fmt: skip
    assert probes, "the wizard measures through desktop.probe"
    runs = ast.parse((ROOT / "desktop/benchmark.py").read_text(encoding="utf-8"))
    run_benchmark = next(
        n for n in runs.body if isinstance(n, ast.FunctionDef) and n.name == "run_benchmark"
    )
    called = {getattr(n.func, "id", "") for n in ast.walk(run_benchmark) if isinstance(n, ast.Call)}
    assert "matmul_figures" in called and "matmul_tflops" not in called


def test_a_cached_bench_says_so_and_when_it_was_measured(
    recorded_matmuls: list[tuple], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--quick"]) == 0
    first = capsys.readouterr()
    assert "benchmarking" in first.err and "took" in first.out
    measured = len(recorded_matmuls)
    assert main(["bench", "--quick"]) == 0
    again = capsys.readouterr()
    assert len(recorded_matmuls) == measured  # nothing measured again
    assert "benchmarking" not in again.err + again.out
    assert "the cached result for this hardware, measured " in again.err
    assert "TFLOP/s" in again.out
    assert main(["bench", "--quick", "--force"]) == 0
    assert "benchmarking" in capsys.readouterr().err and len(recorded_matmuls) > measured
    assert main(["bench", "--quick", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is True


@pytest.fixture
def httpx_filters():
    """The httpx logger's filters as they were, put back after the test."""
    logger = logging.getLogger("httpx")
    before = list(logger.filters)
    yield
    logger.filters[:] = before


def test_heartbeats_are_logged_at_debug(caplog: pytest.LogCaptureFixture, httpx_filters) -> None:
    """What `gpuflex-node run` sets up: the HTTP client's request lines (a heartbeat every few
    seconds) at DEBUG; the agent's own INFO lines stay."""
    quiet_routine_requests()
    quiet_routine_requests()  # once, however often it is called
    assert len(logging.getLogger("httpx").filters) == 1
    ok = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    with httpx.Client(transport=ok, base_url="http://market.test") as client:
        with caplog.at_level(logging.INFO):
            client.post("/api/v1/agent/heartbeat", json={"state": "idle"})
            logging.getLogger("gpuflex.agent").info("task abc leased")
        assert [r.getMessage() for r in caplog.records] == ["task abc leased"]
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            client.post("/api/v1/agent/heartbeat", json={"state": "idle"})
    beats = [r for r in caplog.records if r.name == "httpx"]
    assert len(beats) == 1 and beats[0].levelname == "DEBUG"
    assert "heartbeat" in beats[0].getMessage()
