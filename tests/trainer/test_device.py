"""The training device: a CUDA device always carries its index."""

from __future__ import annotations

import pytest
import torch
from torch.cuda._utils import _get_device_index

from trainer.device import best_device


def test_a_bare_cuda_device_gets_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.set_per_process_memory_fraction refuses a bare "cuda" ("Expected a
    torch.device with a specified index"): every sandboxed GPU task died of it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for device in (best_device(), best_device("cuda")):
        assert device == torch.device("cuda", 0)
        assert _get_device_index(device, optional=False) == 0  # the check that failed
    with pytest.raises(ValueError, match="specified index"):
        _get_device_index(torch.device("cuda"), optional=False)
    assert best_device("cuda:1") == torch.device("cuda", 1)
    assert best_device("cpu") == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_task_memory_cap_takes_the_real_device() -> None:
    device = best_device()
    torch.cuda.set_per_process_memory_fraction(0.9, device)
    assert device.type == "cuda" and device.index is not None
