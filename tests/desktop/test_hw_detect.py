"""Detection: a clear CPU fallback here, NVML failures handled, GPU paths where a GPU exists."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from desktop import hardware
from desktop.hardware import Nvml, detect, gpu_metrics

no_cuda = not torch.cuda.is_available()


@pytest.mark.skipif(not no_cuda, reason="this machine has a CUDA GPU")
def test_cpu_only_machine_gets_a_clear_report() -> None:
    report = detect(Nvml())
    assert report.accelerator == "cpu"
    assert report.gpus == [] or all(g.backend == "none" for g in report.gpus)
    assert any("no GPU" in n or "cannot use" in n for n in report.notes)
    assert report.cpu_threads >= 1 and report.ram_total_mb > 0
    assert "CPU" in report.summary() and "trains on cpu" in report.summary()
    assert len(report.fingerprint()) == 16


def test_real_pynvml_without_a_driver_is_handled() -> None:
    """The real pynvml: where libnvidia-ml is missing nvmlInit raises NVMLError."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        nv = Nvml()
        assert nv.start() is False
        assert nv.error.startswith("NVML:")
        assert nv.count() == 0 and nv.gpu(0) is None and nv.processes(0) is None
        report = detect(nv)
        assert nv.error in report.notes
        m = gpu_metrics(0, nv=nv)
        assert m == hardware.GpuMetrics(None, None, None, None)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here; covered by the GPU test")


def test_a_broken_nvml_call_does_not_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that initialises but fails on queries (a GPU fallen off the bus)."""
    import pynvml

    class Boom(pynvml.NVMLError):
        def __init__(self) -> None:
            self.value = pynvml.NVML_ERROR_GPU_IS_LOST

    def raising(*args: object) -> object:
        raise Boom()

    fake = SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
                           nvmlDeviceGetHandleByIndex=raising)  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = Nvml()
    assert nv.start() and nv.count() == 1
    assert nv.gpu(0) is None and "GPU 0" in nv.error
    report = detect(nv)
    assert any("GPU 0" in n for n in report.notes)


def test_nvml_gpu_is_reported_with_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NVML path end to end on a scripted library (the real one needs a GPU)."""
    proc = SimpleNamespace(pid=4242, usedGpuMemory=512 * 2**20)
    fake = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetName=lambda h: b"NVIDIA GeForce RTX 4090",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=24 * 2**30, used=2**30),
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 9),
        nvmlSystemGetDriverVersion=lambda: "550.54",
        nvmlDeviceGetUUID=lambda h: "GPU-1234",
        nvmlDeviceGetTemperature=lambda h, s: 61,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=37),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = Nvml()
    report = detect(nv)
    gpu = report.primary_gpu
    assert gpu is not None and gpu.name == "NVIDIA GeForce RTX 4090"
    assert gpu.memory_total_mb == 24 * 1024 and gpu.driver == "550.54"
    assert gpu.compute_capability == "8.9" and gpu.temperature_c == 61.0
    m = gpu_metrics(0, nv=nv)
    assert m.other_processes == [(4242, 512)] and m.utilization_pct == 37.0
    assert gpu_metrics(0, own_pids={4242}, nv=nv).other_processes == []
    # a driver update changes the fingerprint, so the benchmark re-runs
    fake.nvmlSystemGetDriverVersion = lambda: "555.1"
    assert detect(Nvml()).fingerprint() != report.fingerprint()


def test_missing_pyamdgpuinfo_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyamdgpuinfo", None)  # import fails
    notes: list[str] = []
    assert hardware._amd_gpus(notes) == []


def test_cli_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    from desktop.cli import main

    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["accelerator"] in ("cpu", "cuda", "mps")
    assert data["fingerprint"] and "sandbox" in data


@pytest.mark.gpu
@pytest.mark.skipif(no_cuda, reason="needs a CUDA GPU")
def test_real_gpu_is_detected() -> None:
    report = detect(Nvml())
    assert report.accelerator == "cuda"
    gpu = report.primary_gpu
    assert gpu is not None and gpu.memory_total_mb > 0 and gpu.vendor in ("nvidia", "amd")
    if gpu.vendor == "nvidia":
        assert gpu.driver and gpu.temperature_c is not None


def test_amd_gpu_through_pyamdgpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeAmd:
        def __init__(self) -> None:
            self.name = "AMD Radeon RX 7900 XTX"
            self.memory_info = {"vram_size": 24 * 2**30}

        def query_temperature(self) -> float:
            return 55.0

        def query_load(self) -> float:
            return 0.25

        def query_vram_usage(self) -> int:
            return 2**30

    fake = SimpleNamespace(detect_gpus=lambda: 1, get_gpu=lambda i: FakeAmd())
    monkeypatch.setitem(sys.modules, "pyamdgpuinfo", fake)
    monkeypatch.setattr(hardware.platform, "system", lambda: "Linux")
    notes: list[str] = []
    (gpu,) = hardware._amd_gpus(notes)
    assert gpu.vendor == "amd" and gpu.memory_total_mb == 24 * 1024
    assert gpu.temperature_c == 55.0 and gpu.utilization_pct == 25.0 and notes == []


def test_apple_gpu_through_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine reports its CUDA GPU first")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    report = detect(Nvml())
    assert report.accelerator == "mps"
    assert report.primary_gpu is not None and report.primary_gpu.vendor == "apple"
