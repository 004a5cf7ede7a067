"""Plan classes (as BOINC calls them): which build of the training runtime suits this machine.

`cpu` runs anywhere; `cuda13` and `cuda12` need an NVIDIA GPU whose driver is at least the
pack's `min_driver` (the newest CUDA the driver runs is preferred: PyPI's own torch 2.13.0
wheels are CUDA 13.0 builds, PyTorch's cu12x indexes hold the CUDA 12 ones); `rocm` an AMD
GPU on Linux with the ROCm kernel driver (/dev/kfd); `mps` an Apple silicon Mac. The choice
falls back to `cpu` when the GPU's own plan is impossible here (a driver too old, no pack
published for it), and says why, so the owner knows what to fix.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PLANS = ("cpu", "cuda12", "cuda13", "rocm", "mps")
GPU_PLANS = ("cuda12", "cuda13", "rocm", "mps")
CUDA_PLANS = ("cuda13", "cuda12")  # most preferred first

# The oldest Linux driver each CUDA toolkit release needs (NVIDIA's CUDA toolkit release
# notes, table 3). A pack's manifest names its own minimum; this fills it in at build time.
CUDA_MIN_DRIVER = {
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


@dataclass(frozen=True)
class Machine:
    """What the plan choice needs to know, from desktop/hardware.py's report (no torch here)."""

    system: str  # platform.system(): "Linux" | "Windows" | "Darwin"
    arch: str  # platform.machine(): "x86_64" | "arm64" | ...
    nvidia_driver: str = ""  # the NVIDIA driver version NVML reports; "" without one
    amd_gpu: bool = False  # an AMD GPU the ROCm kernel driver (/dev/kfd) serves
    apple_gpu: bool = False

    @classmethod
    def from_gpus(cls, gpus: Sequence[Any], system: str = "", arch: str = "") -> Machine:
        """From desktop.hardware.GpuInfo values (or anything with vendor and driver)."""
        system = system or platform.system()
        arch = arch or platform.machine()
        nvidia = [g for g in gpus if g.vendor == "nvidia" and g.driver]
        return cls(
            system=system,
            arch=arch,
            nvidia_driver=nvidia[0].driver if nvidia else "",
            amd_gpu=any(g.vendor == "amd" for g in gpus) and os.path.exists("/dev/kfd"),
            apple_gpu=system == "Darwin" and arch == "arm64",
        )

    @classmethod
    def here(cls) -> Machine:
        """This machine, without torch: NVML for NVIDIA, /dev/kfd for AMD, the OS for Apple."""
        from desktop.hardware import nvml

        nv = nvml()
        gpus = [g for g in (nv.gpu(i) for i in range(nv.count())) if g is not None]
        machine = cls.from_gpus(gpus)
        if not machine.amd_gpu and platform.system() == "Linux" and os.path.exists("/dev/kfd"):
            machine = cls(machine.system, machine.arch, machine.nvidia_driver, amd_gpu=True)
        return machine


@dataclass(frozen=True)
class Choice:
    plan: str
    reason: str  # one line for the owner: why this plan, and what a GPU plan would need


def driver_tuple(version: str) -> tuple[int, ...]:
    """'570.26' -> (570, 26); anything unparsable is (0,), older than every minimum."""
    parts = []
    for piece in version.strip().split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts) or (0,)


def driver_ok(have: str, need: str) -> bool:
    return not need or driver_tuple(have) >= driver_tuple(need)


def gpu_plan(machine: Machine) -> str | None:
    """The plan family this machine's GPU would run, before any pack is considered."""
    if machine.nvidia_driver and machine.system in ("Linux", "Windows"):
        return "cuda"
    if machine.amd_gpu and machine.system == "Linux":
        return "rocm"
    # mps only on an Apple silicon Mac, whatever else said apple_gpu: its pack is macOS wheels
    if machine.apple_gpu and machine.system == "Darwin" and machine.arch == "arm64":
        return "mps"
    return None


def choose(machine: Machine, published: Mapping[str, Mapping[str, Any]]) -> Choice:
    """The plan class to run, given the manifests published per plan (pack.Manifest.to_dict()
    or an installed pack's). An empty `published` asks what the machine could run at all."""
    want = gpu_plan(machine)
    if want is None:
        return Choice("cpu", "no supported GPU found: the cpu runtime")
    if want != "cuda":
        if published and want not in published:
            return Choice("cpu", f"no {want} pack is published: the cpu runtime")
        return Choice(want, f"{want} for this machine's GPU")
    driver = machine.nvidia_driver
    if not published:
        return Choice(CUDA_PLANS[0], f"{CUDA_PLANS[0]} for this machine's GPU, driver {driver}")
    offered = [p for p in CUDA_PLANS if p in published]
    if not offered:
        return Choice("cpu", "no CUDA pack (cuda13, cuda12) is published: the cpu runtime")
    for plan in offered:
        if driver_ok(driver, str(published[plan].get("min_driver") or "")):
            return Choice(plan, f"{plan} for this machine's GPU, driver {driver}")
    oldest = offered[-1]
    need = published[oldest].get("min_driver")
    return Choice(
        "cpu",
        f"NVIDIA driver {driver} is older than the {need} the {oldest} pack needs (CUDA "
        f"{published[oldest].get('cuda', '?')}): the cpu runtime; update the driver to train "
        "on the GPU",
    )
