"""Which accelerator local training runs on: CUDA (also ROCm builds of torch), MPS, else CPU."""

from __future__ import annotations

import torch


def best_device(preferred: str | None = None) -> torch.device:
    if preferred:
        return torch.device(preferred)
    if torch.cuda.is_available():  # true on ROCm builds too: torch maps HIP onto torch.cuda
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
