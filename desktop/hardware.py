"""What compute this machine has: NVIDIA (NVML), AMD (pyamdgpuinfo / ROCm torch), Apple (MPS), CPU.

Detection never raises: every probe that fails (no driver, no library, a broken GPU) becomes a
line in `HardwareReport.notes`, and a machine with nothing usable is reported as a CPU node.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psutil

from desktop import __version__
from desktop.own_processes import foreign


@dataclass(frozen=True)
class GpuInfo:
    index: int
    vendor: str  # "nvidia" | "amd" | "apple"
    name: str
    memory_total_mb: int
    backend: str  # how torch reaches it: "cuda" | "rocm" | "mps" | "none"
    driver: str = ""
    uuid: str = ""
    compute_capability: str = ""
    temperature_c: float | None = None
    utilization_pct: float | None = None
    memory_used_mb: int | None = None


@dataclass(frozen=True)
class HardwareReport:
    cpu_name: str
    cpu_cores: int
    cpu_threads: int
    ram_total_mb: int
    os: str
    python: str
    torch_version: str
    torch_cuda: str  # CUDA or HIP version torch was built with; "" for a CPU build
    accelerator: str  # what training will use: "cuda" | "mps" | "cpu"
    gpus: list[GpuInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def primary_gpu(self) -> GpuInfo | None:
        return self.gpus[0] if self.gpus else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareReport:
        gpus = [GpuInfo(**g) for g in data.get("gpus", [])]
        return cls(**{**data, "gpus": gpus})

    def fingerprint(self) -> str:
        """Changes whenever a benchmark figure could: GPUs, drivers, torch, CPU, this app."""
        stable = {
            "cpu": [self.cpu_name, self.cpu_cores, self.cpu_threads],
            "gpus": [[g.vendor, g.name, g.memory_total_mb, g.driver, g.uuid] for g in self.gpus],
            "torch": [self.torch_version, self.torch_cuda],
            "accelerator": self.accelerator,
            "app": __version__,
        }
        return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]

    def summary(self) -> str:
        lines = [
            f"CPU     {self.cpu_name} ({self.cpu_cores} cores, {self.cpu_threads} threads)",
            f"RAM     {self.ram_total_mb / 1024:.1f} GiB",
        ]
        for g in self.gpus:
            extra = f", driver {g.driver}" if g.driver else ""
            lines.append(
                f"GPU {g.index}   {g.name} ({g.memory_total_mb / 1024:.1f} GiB, {g.backend}{extra})"
            )
        if not self.gpus:
            lines.append("GPU     none usable: training runs on the CPU")
        lines.append(f"torch   {self.torch_version} → trains on {self.accelerator}")
        lines += [f"note    {n}" for n in self.notes]
        return "\n".join(lines)


# ------------------------------------------------------------------------------- NVML


class Nvml:
    """One NVML session for the process; `available` is False (with `error` set) when the
    library or driver is missing, and every query then answers None instead of raising."""

    _lock = threading.Lock()

    def __init__(self) -> None:
        self.available = False
        self.error = ""
        self._nv: Any = None
        self._started = False

    def start(self) -> bool:
        with self._lock:
            if self._started:
                return self.available
            self._started = True
            try:
                import pynvml

                pynvml.nvmlInit()
            except ImportError:
                self.error = "NVML: nvidia-ml-py is not installed"
            except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
                self.error = f"NVML: {_nvml_message(exc)} (no NVIDIA driver?)"
            else:
                self._nv = pynvml
                self.available = True
            return self.available

    def count(self) -> int:
        if not self.start():
            return 0
        try:
            return int(self._nv.nvmlDeviceGetCount())
        except Exception as exc:
            self.error = f"NVML: {_nvml_message(exc)}"
            return 0

    def gpu(self, index: int) -> GpuInfo | None:
        if not self.start():
            return None
        nv = self._nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            major, minor = _try(lambda: nv.nvmlDeviceGetCudaComputeCapability(h), (0, 0))
            return GpuInfo(
                index=index,
                vendor="nvidia",
                name=_text(nv.nvmlDeviceGetName(h)),
                memory_total_mb=int(mem.total // 2**20),
                backend="cuda",  # detect() says "none" where this torch build cannot use it
                driver=_text(_try(nv.nvmlSystemGetDriverVersion, "")),
                uuid=_text(_try(lambda: nv.nvmlDeviceGetUUID(h), "")),
                compute_capability=f"{major}.{minor}" if major else "",
                temperature_c=_try(
                    lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), None
                ),
                utilization_pct=_try(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu), None),
                memory_used_mb=int(mem.used // 2**20),
            )
        except Exception as exc:
            self.error = f"NVML: GPU {index}: {_nvml_message(exc)}"
            return None

    def processes(self, index: int) -> list[tuple[int, int]] | None:
        """(pid, used GPU memory in MB) of every compute and graphics process on the GPU."""
        if not self.start():
            return None
        nv = self._nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            procs: dict[int, int] = {}
            for query in (
                nv.nvmlDeviceGetComputeRunningProcesses,
                nv.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                for p in _try(lambda q=query: q(h), []):
                    used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
                    procs[int(p.pid)] = max(procs.get(int(p.pid), 0), used // 2**20)
            return sorted(procs.items())
        except Exception:
            return None


def _nvml_message(exc: Exception) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # some NVMLError subclasses fail in __str__ when the library is gone
        return type(exc).__name__


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default


_NVML = Nvml()


def nvml() -> Nvml:
    return _NVML


# -------------------------------------------------------------------------------- AMD


def _amd_gpus(notes: list[str]) -> list[GpuInfo]:
    """pyamdgpuinfo (Linux, optional extra); imported lazily so its absence costs nothing."""
    if platform.system() != "Linux":
        return []
    try:
        import pyamdgpuinfo  # type: ignore[import-not-found]
    except ImportError:
        if os.path.exists("/dev/kfd"):
            notes.append("AMD GPU device found but pyamdgpuinfo is missing (pip gpuflex[amd])")
        return []
    gpus = []
    try:
        for i in range(pyamdgpuinfo.detect_gpus()):
            g = pyamdgpuinfo.get_gpu(i)
            gpus.append(
                GpuInfo(
                    index=i,
                    vendor="amd",
                    name=str(getattr(g, "name", None) or "AMD GPU"),
                    memory_total_mb=int(g.memory_info["vram_size"] // 2**20),
                    backend="rocm" if _rocm_torch() else "none",
                    temperature_c=_try(lambda g=g: float(g.query_temperature()), None),
                    utilization_pct=_try(lambda g=g: 100.0 * float(g.query_load()), None),
                    memory_used_mb=_try(lambda g=g: int(g.query_vram_usage() // 2**20), None),
                )
            )
    except Exception as exc:
        notes.append(f"pyamdgpuinfo failed: {exc}")
    return gpus


def _rocm_torch() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()


def _torch_cuda_gpus(vendor: str, backend: str) -> list[GpuInfo]:
    """GPUs as torch sees them: NVIDIA without NVML, or AMD through a ROCm build."""
    import torch

    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            GpuInfo(
                index=i,
                vendor=vendor,
                name=p.name,
                memory_total_mb=int(p.total_memory // 2**20),
                backend=backend,
                compute_capability=f"{p.major}.{p.minor}" if vendor == "nvidia" else "",
            )
        )
    return gpus


def _mps_gpu() -> GpuInfo | None:
    import torch

    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return None
    # Apple GPUs share the machine's unified memory
    return GpuInfo(
        index=0,
        vendor="apple",
        name=f"Apple GPU ({platform.machine()})",
        memory_total_mb=int(psutil.virtual_memory().total // 2**20),
        backend="mps",
        driver=platform.mac_ver()[0],
    )


# -------------------------------------------------------------------------------- CPU


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# ------------------------------------------------------------------------------ detect


def detect(nv: Nvml | None = None) -> HardwareReport:
    """Everything about this machine's compute, with a note for each probe that failed.

    Imports torch (some 230 MB resident for good): the agent calls it in a child process
    (desktop.probe) so that only its sandboxed tasks hold torch."""
    import torch

    nv = nv or nvml()
    notes: list[str] = []
    gpus: list[GpuInfo] = []

    count = nv.count()
    cuda = torch.cuda.is_available()
    gpus += [
        g if cuda else replace(g, backend="none")
        for g in (nv.gpu(i) for i in range(count))
        if g is not None
    ]
    if nv.error:
        notes.append(nv.error)

    if not gpus and torch.cuda.is_available():
        if _rocm_torch():
            gpus += _amd_gpus(notes) or _torch_cuda_gpus("amd", "rocm")
        else:
            gpus += _torch_cuda_gpus("nvidia", "cuda")
    elif not gpus:
        gpus += _amd_gpus(notes)

    if not gpus:
        mps = _mps_gpu()
        if mps:
            gpus.append(mps)

    if gpus and not torch.cuda.is_available() and gpus[0].backend in ("none", "cuda"):
        notes.append(
            f"this torch build ({torch.__version__}) cannot use the {gpus[0].vendor} GPU; "
            "training falls back to the CPU"
        )
    if not gpus:
        notes.append("no GPU found: this node offers its CPU only")

    if torch.cuda.is_available():
        accelerator = "cuda"
    elif any(g.backend == "mps" for g in gpus):
        accelerator = "mps"
    else:
        accelerator = "cpu"

    return HardwareReport(
        cpu_name=cpu_name(),
        cpu_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        cpu_threads=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        ram_total_mb=int(psutil.virtual_memory().total // 2**20),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch_version=torch.__version__,
        torch_cuda=str(torch.version.cuda or getattr(torch.version, "hip", None) or ""),
        accelerator=accelerator,
        gpus=gpus,
        notes=notes,
    )


@dataclass(frozen=True)
class GpuMetrics:
    """Live figures for heartbeats and the work policy; None where nothing can tell."""

    utilization_pct: float | None
    temperature_c: float | None
    memory_used_mb: int | None
    other_processes: list[tuple[int, int]] | None  # (pid, MB) of programs other than GPUFlex


def gpu_metrics(
    index: int = 0, own_pids: set[int] | None = None, nv: Nvml | None = None
) -> GpuMetrics:
    nv = nv or nvml()
    info = nv.gpu(index) if nv.count() > index else None
    if info is None:
        return amd_metrics(index)
    procs = nv.processes(index)
    others = None if procs is None else foreign(procs, own_pids)
    return GpuMetrics(info.utilization_pct, info.temperature_c, info.memory_used_mb, others)


class AmdGpus:
    """Live figures of AMD GPUs through pyamdgpuinfo (the optional `amd` extra, Linux): load,
    temperature and VRAM in use. It lists no processes, so `other_processes` stays None and
    the work policy judges a busy GPU by its load instead (desktop.policy)."""

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._tried = module is not None
        self._gpus: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _lib(self) -> Any:
        if not self._tried:  # imported once: a failed import would search the path each time
            self._tried = True
            if platform.system() == "Linux":
                try:
                    import pyamdgpuinfo  # type: ignore[import-not-found]

                    self._module = pyamdgpuinfo
                except ImportError:
                    pass
        return self._module

    def _gpu(self, index: int) -> Any:
        lib = self._lib()
        if lib is None:
            return None
        with self._lock:
            if index not in self._gpus:
                try:
                    gpu = lib.get_gpu(index) if index < lib.detect_gpus() else None
                except Exception:
                    gpu = None
                if gpu is not None:
                    # its load is sampled by a polling thread of its own (pyamdgpuinfo 2)
                    _try(getattr(gpu, "start_utilisation_polling", lambda: None), None)
                self._gpus[index] = gpu
            return self._gpus[index]

    def metrics(self, index: int) -> GpuMetrics:
        g = self._gpu(index)
        if g is None:
            return GpuMetrics(None, None, None, None)
        return GpuMetrics(
            utilization_pct=_try(lambda: 100.0 * float(g.query_load()), None),
            temperature_c=_try(lambda: float(g.query_temperature()), None),
            memory_used_mb=_try(lambda: int(g.query_vram_usage() // 2**20), None),
            other_processes=None,
        )


_AMD = AmdGpus()


def amd_metrics(index: int = 0) -> GpuMetrics:
    return _AMD.metrics(index)
