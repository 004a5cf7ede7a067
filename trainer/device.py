"""Which accelerator local training runs on: CUDA (also ROCm builds of torch), MPS, else CPU."""

from __future__ import annotations

import torch


def best_device(preferred: str | None = None) -> torch.device:
    """The device to train on; a CUDA device always carries its index, since some torch calls
    (torch.cuda.set_per_process_memory_fraction) refuse a bare "cuda"."""
    device = torch.device(preferred) if preferred else _first_available()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _first_available() -> torch.device:
    if torch.cuda.is_available():  # true on ROCm builds too: torch maps HIP onto torch.cuda
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
