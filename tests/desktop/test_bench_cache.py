"""Benchmark: sane figures on the CPU, cached per fingerprint, GPU comparison to peaks."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from desktop import benchmark as bm
from desktop.hardware import HardwareReport
from desktop.probe import ProbeFailed, probe


@pytest.fixture(scope="module")
def quick_result(hardware: HardwareReport) -> bm.BenchmarkResult:
    return bm.run_benchmark(hardware, quick=True, device="cpu")


def test_quick_cpu_benchmark_is_sane(quick_result: bm.BenchmarkResult) -> None:
    r = quick_result
    assert r.device == "cpu" and r.quick
    assert r.matmul_tflops["fp32"] is not None and r.matmul_tflops["fp32"] > 0
    for v in r.matmul_tflops.values():
        assert v is None or (math.isfinite(v) and v > 0)
    assert r.memory_gbps > 0
    assert r.h2d_gbps is None and r.d2h_gbps is None  # no separate device memory
    assert r.train_samples_per_s["mlp"] > 0
    assert r.peak_ratio == {}  # CPUs have no entry in the peaks table
    assert "TFLOP/s" in r.summary()
    assert r.advertised()["fp32_tflops"] == r.matmul_tflops["fp32"]


def test_cache_is_reused_and_invalidated_by_the_fingerprint(
    tmp_path: Path, hardware: HardwareReport, quick_result: bm.BenchmarkResult,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    runs: list[bool] = []

    def fake_run(hw: HardwareReport, quick: bool = False, device: str | None = None):
        runs.append(quick)
        return dataclasses.replace(quick_result, fingerprint=hw.fingerprint(), quick=quick)

    monkeypatch.setattr(bm, "run_benchmark", fake_run)
    first, cached = bm.benchmark(hardware, tmp_path, quick=True)
    assert not cached and runs == [True]
    again, cached = bm.benchmark(hardware, tmp_path, quick=True)
    assert cached and runs == [True] and again.to_dict() == first.to_dict()
    # a full run is not satisfied by a quick cache entry
    _, cached = bm.benchmark(hardware, tmp_path, quick=False)
    assert not cached and runs == [True, False]
    # a new driver: different fingerprint, the benchmark runs again
    updated = dataclasses.replace(hardware, torch_cuda="99.9")
    assert updated.fingerprint() != hardware.fingerprint()
    _, cached = bm.benchmark(updated, tmp_path, quick=True)
    assert not cached and len(runs) == 3
    # a damaged cache file is ignored, not fatal
    (tmp_path / "benchmark.json").write_text("{not json")
    _, cached = bm.benchmark(updated, tmp_path, quick=True)
    assert not cached


def test_published_peaks_match_gpu_names() -> None:
    assert bm.published_peak("NVIDIA H100 PCIe")[0] == "H100 PCIe"
    assert bm.published_peak("NVIDIA H100 80GB HBM3")[0] == "H100"
    assert bm.published_peak("NVIDIA H200")[0] == "H200"
    assert bm.published_peak("NVIDIA GeForce RTX 4090")[1]["fp32"] == 82.6
    assert bm.published_peak("AMD Instinct MI300X")[0] == "MI300X"
    assert bm.published_peak("Some Unknown GPU") is None


def test_cli_bench_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    from desktop.cli import main

    assert main(["bench", "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["matmul_tflops"]["fp32"] > 0 and data["cached"] is False
    assert main(["bench", "--quick", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_benchmark_against_published_peak(hardware: HardwareReport) -> None:
    r = bm.run_benchmark(hardware, quick=True)
    assert r.device.startswith("cuda")
    assert r.h2d_gbps and r.d2h_gbps and r.memory_gbps > 10
    assert r.matmul_tflops["fp16"] and r.matmul_tflops["fp16"] > r.matmul_tflops["fp32"]
    if r.peak_source:
        assert 0 < r.peak_ratio["fp32"] < 1.5


def test_a_simulated_slower_gpu_advertises_scaled_figures(
    quick_result: bm.BenchmarkResult,
) -> None:
    slow = quick_result.scaled(0.25)
    fp32 = quick_result.matmul_tflops["fp32"]
    assert fp32 is not None and slow.matmul_tflops["fp32"] == pytest.approx(fp32 / 4)
    assert slow.memory_gbps == pytest.approx(quick_result.memory_gbps / 4)
    for model, sps in quick_result.train_samples_per_s.items():
        assert slow.train_samples_per_s[model] == pytest.approx(sps / 4)
    assert "simulated" in slow.device_name and slow.fingerprint == quick_result.fingerprint


def test_the_probe_measures_in_a_child_and_caches(tmp_path: Path, hardware: HardwareReport) -> None:
    """What the agent, the tray app and the demo use: detect and benchmark in a child process
    (their own process never imports torch); the figures come back whole and are cached."""
    hw, result, cached = probe(tmp_path, quick=True)
    assert hw == hardware and not cached
    assert result is not None and result.fingerprint == hardware.fingerprint()
    assert result.train_samples_per_s["mlp"] > 0
    assert bm.load_cached(tmp_path, hardware, quick=True) == result
    assert probe(tmp_path, quick=True)[1:] == (result, True)
    assert probe(tmp_path / "none", measure=False) == (hardware, None, False)
    assert not (tmp_path / "none").exists()


def test_a_probe_that_fails_says_why(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    with pytest.raises(ProbeFailed, match=r"measuring this machine failed: (.|\n)*cache"):
        probe(tmp_path / "cache", quick=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_agents_probe_leaves_no_cuda_context_and_no_torch_in_its_process(
    tmp_path: Path,
) -> None:
    # a fresh process: this one may hold a context from other GPU tests
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from desktop.probe import probe\n"
        "_, result, _ = probe(Path(sys.argv[1]), quick=True)\n"
        "print(json.dumps([result.device, result.matmul_tflops['bf16'],"
        " 'torch' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=300, check=True).stdout  # fmt: skip
    device, bf16, has_torch = json.loads(out.splitlines()[-1])
    assert device.startswith("cuda") and bf16 > 0
    assert has_torch is False  # so no CUDA context either: the child's exit took it
