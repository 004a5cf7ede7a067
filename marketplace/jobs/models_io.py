"""Global models in storage: encoded once per round, cached decoded per process."""

from __future__ import annotations

import json
from functools import lru_cache

import torch
from torch import nn

from marketplace.jobs import files
from marketplace.jobs.models import Job
from trainer.hashing import state_hash
from trainer.models import build_model
from trainer.updates import decode_state, encode_state

State = dict[str, torch.Tensor]


def model_metadata(job: Job, round_number: int) -> dict[str, str]:
    """What an agent needs besides the spec to build the model: the data's shape and classes."""
    return {
        "job": str(job.id),
        "round": str(round_number),
        "input_shape": json.dumps(list(job.input_shape)),
        "num_classes": str(job.num_classes),
        "task": job.task_kind,
    }


def store_model(job: Job, round_number: int, state: State) -> tuple[str, str]:
    """Store a global model; returns (state hash, storage name). Idempotent by content."""
    digest = state_hash(state)
    name = f"{files.job_dir(job.id)}/models/{digest}.safetensors"
    files.put(name, encode_state(state, model_metadata(job, round_number)), content_addressed=True)
    return digest, name


@lru_cache(maxsize=16)
def load_model_file(name: str) -> State:
    """Decoded tensors of a stored model. Cached: names are content hashes, never rewritten."""
    state, _ = decode_state(files.get(name))
    return state


def new_model(job: Job) -> nn.Module:
    spec = job.parsed_spec
    if spec.model.arch == "exported":  # the buyer's program, from the job's stored copy
        from marketplace.jobs.model_files import program_name

        with files.local_copy(program_name(job.pk), ".pt2") as path:
            here = spec.model.model_copy(update={"program": str(path)})
            return build_model(here, tuple(job.input_shape), job.num_classes, seed=spec.seed)
    return build_model(spec.model, tuple(job.input_shape), job.num_classes, seed=spec.seed)
