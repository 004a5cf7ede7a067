"""One agent, every GPU: which GPUs get a lane of their own, and what pins a task to its GPU.

A machine with two or more GPUs that tasks can use (CUDA or ROCm) runs one lane per GPU
under its one Agent (desktop.agent): each lane is a node of its own on the marketplace
("<name>-gpu<i>", with that GPU's hardware and benchmark), with its own node key, journal,
task folder, sandbox and work policy, so a game on GPU 1 pauses only GPU 1's task. A
machine with one GPU (or Apple's one MPS device, or none) has no lanes: its agent works
exactly as it always did. The owner can leave GPUs out (`excluded_gpus`).

GPU indices are NVML's (PCI bus order, as `nvidia-smi` numbers them); a lane's sandbox gets
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA numbers them the same way (its default order puts
the fastest first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from desktop.config import Paths
from desktop.hardware import GpuInfo, HardwareReport

LANE_BACKENDS = ("cuda", "rocm")  # GPUs one process can be pinned to; MPS is one device


def plan_lanes(hw: HardwareReport, excluded: Sequence[int] = ()) -> list[GpuInfo] | None:
    """The GPUs that each get a lane, or None for no lanes: the agent works as one node, the
    way a single-GPU or CPU-only machine always has. Any exclusion means lanes, so that the
    GPUs left are the ones used (an empty list: every GPU is excluded)."""
    usable = [g for g in hw.gpus if g.backend in LANE_BACKENDS]
    if not excluded and len(usable) < 2:
        return None
    if not usable:
        return None  # nothing a lane could pin: excluding a GPU the tasks never use changes nothing
    return [g for g in usable if g.index not in set(excluded)]


def lane_env(gpu: GpuInfo) -> dict[str, str]:
    """What a lane's sandbox sets so its task sees only its GPU (as the task's device 0)."""
    # GPUFLEX_DEVICE emptied: an owner's global choice (cuda:1) would name no visible device
    if gpu.backend == "rocm":
        return {"HIP_VISIBLE_DEVICES": str(gpu.index), "GPUFLEX_DEVICE": ""}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu.index),
            "GPUFLEX_DEVICE": ""}  # fmt: skip


def lane_hardware(hw: HardwareReport, index: int) -> HardwareReport:
    """The host's report as one lane's node sees it: only its GPU (so its fingerprint, and
    the benchmark cached under it, are that GPU's)."""
    gpus = [g for g in hw.gpus if g.index == index]
    return replace(hw, gpus=gpus)


def lane_paths(paths: Paths, index: int) -> Paths:
    """A lane's own data (journal, task folders, inputs) and benchmark cache. GPU 0's lane
    keeps the host's data folder, so a machine that gains a second GPU (or an upgrade)
    carries on the node, and the tasks, it had as a one-GPU node; each lane's benchmark is
    cached apart (the host's own stays where it was)."""
    data = paths.data if index == 0 else paths.data / f"gpu{index}"
    return Paths(config=paths.config, data=data, cache=paths.cache / f"gpu{index}")


def lane_scope(server_url: str, index: int) -> str:
    """The name a lane's node key and id are kept under (desktop.config.Credentials); GPU 0's
    is the server's, as a one-GPU node's always was."""
    return server_url if index == 0 else f"{server_url}#gpu{index}"


def lane_name(base: str, index: int) -> str:
    return f"{base}-gpu{index}"
