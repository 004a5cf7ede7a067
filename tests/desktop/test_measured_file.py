"""`gpuflex-node run --measured FILE`: an agent started with figures measured already (the
demo measures its machine once for five agents) runs no probe, and a file it cannot take is
refused with a line naming the file and why."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

import desktop.agent
import desktop.daemon
from desktop.bench_result import BenchmarkResult
from desktop.cli import main
from desktop.hardware import GpuInfo, HardwareReport
from desktop.probe import MeasuredFileError, load_measured, save_measured


def test_the_figures_come_back_as_saved(
    tmp_path: Path, hardware: HardwareReport, fake_bench: BenchmarkResult
) -> None:
    path = tmp_path / "figures" / "measured.json"
    save_measured(path, hardware, fake_bench)
    assert load_measured(path) == (hardware, fake_bench)


def test_the_probes_own_output_is_taken(
    tmp_path: Path, hardware: HardwareReport, fake_bench: BenchmarkResult
) -> None:
    """What `python -m desktop.probe CACHE_DIR` prints (desktop.probe.main), "cached" too."""
    line = {"hardware": hardware.to_dict(), "benchmark": fake_bench.to_dict(), "cached": True}
    (tmp_path / "probe.json").write_text(json.dumps(line))
    assert load_measured(tmp_path / "probe.json") == (hardware, fake_bench)


def test_another_machines_benchmark_is_refused(
    tmp_path: Path, hardware: HardwareReport, fake_bench: BenchmarkResult
) -> None:
    other = dataclasses.replace(hardware, torch_cuda="99.9")
    save_measured(tmp_path / "m.json", other, fake_bench)
    with pytest.raises(MeasuredFileError, match="other hardware"):
        load_measured(tmp_path / "m.json")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("not json", "is not JSON"),
        ("[]", "no 'hardware' object"),
        ('{"hardware": {}, "benchmark": null}', "no 'benchmark' object"),
        ('{"hardware": {"cpu": 1}, "benchmark": {}}', "does not hold the probe's figures"),
    ],
)
def test_a_file_that_is_not_the_probes_figures_says_why(
    tmp_path: Path, body: str, says: str
) -> None:
    (tmp_path / "m.json").write_text(body)
    with pytest.raises(MeasuredFileError, match=says):
        load_measured(tmp_path / "m.json")


def _spy_on_agents(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The keyword arguments `run` builds its agent with, without starting one."""
    seen: list[dict] = []

    class Spy:
        def __init__(self, settings, paths, **kw) -> None:
            seen.append(kw)

    class NoDaemon:
        @classmethod
        def open(cls, paths, make_agent):
            make_agent()
            return cls()

        def run_forever(self) -> None:
            pass

    monkeypatch.setattr(desktop.agent, "Agent", Spy)
    monkeypatch.setattr(desktop.daemon, "Daemon", NoDaemon)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    return seen


def test_run_starts_the_agent_with_the_figures_given(
    tmp_path: Path, hardware: HardwareReport, fake_bench: BenchmarkResult,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    seen = _spy_on_agents(monkeypatch)
    save_measured(tmp_path / "m.json", hardware, fake_bench)
    assert main(["run", "--measured", str(tmp_path / "m.json")]) == 0
    assert main(["run"]) == 0  # no file: the agent probes, as before
    assert [(kw["hardware"], kw["bench"]) for kw in seen] == [
        (hardware, fake_bench),
        (None, None),
    ]


def test_run_refuses_a_measured_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--measured", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--measured: cannot read") and "none.json" in err


def test_run_refuses_one_figure_for_a_machine_of_gpu_lanes(
    tmp_path: Path, hardware: HardwareReport, fake_bench: BenchmarkResult,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Each GPU of a multi-GPU machine is a node with its own speed (desktop.lanes): one
    benchmark handed to all of them would give every lane the same speed."""
    gpus = [GpuInfo(index=i, vendor="nvidia", name=f"Fake RTX {i}", memory_total_mb=24576,
                    backend="cuda") for i in range(2)]  # fmt: skip
    two = dataclasses.replace(hardware, gpus=gpus)
    save_measured(
        tmp_path / "m.json", two, dataclasses.replace(fake_bench, fingerprint=two.fingerprint())
    )
    assert main(["run", "--measured", str(tmp_path / "m.json")]) == 2
    assert "measures each GPU itself" in capsys.readouterr().err
