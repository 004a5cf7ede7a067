"""A stored model's tensors read from its safetensors header alone, with no torch: what the
web process may know of a model (issue 36: it imports no torch). Stored models are
content-addressed (models_io.store_model names each by its hash), so a name's header never
changes and is read once per process."""

from __future__ import annotations

import math
from functools import lru_cache

from django.core.files.storage import default_storage

from marketplace.jobs import files
from trainer.tensor_header import Entry, parse


@lru_cache(maxsize=64)
def model_header(name: str) -> dict[str, Entry]:
    """The stored model `name`'s tensors as its header names them, reading the header only."""
    with default_storage.open(name, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        entries, _ = parse(fh.read(length), files.size(name) - 8 - length)
    return entries


def stored_numel(name: str) -> int:
    """How many numbers the stored model holds: what the round planner sizes transfers by
    (rounds/sizing.py), equal to the built model's state_dict numel."""
    return sum(math.prod(e.shape) for e in model_header(name).values())
