"""How big a model a job may ask for: a cap that grows with the job's tier and budget.

A spec is cheap to write and a model is not: `hidden: [65536, 65536]` is 17 GB of weights.
The cap is checked on the model's size measured without building it (trainer.fit.
measure_footprint, on the meta device), so an oversized spec is refused before anything is
allocated. A LoRA job counts its frozen base with its adapters: nodes hold and run both.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

BYTES_PER_PARAMETER = 4  # fp32 weights; buffers count against the byte cap as well
# a checkpoint's safetensors header beyond the tensors' bytes: names, shapes, offsets
CHECKPOINT_HEADER_SLACK = 16 * 2**20


@dataclass(frozen=True)
class ModelCap:
    parameters: int
    bytes: int

    @property
    def checkpoint_bytes(self) -> int:
        """The largest checkpoint file a job under this cap may upload (fp32 at most)."""
        return self.bytes + CHECKPOINT_HEADER_SLACK

    def problems(self, parameters: int, nbytes: int, why: str) -> list[tuple[str, str]]:
        if parameters <= self.parameters and nbytes <= self.bytes:
            return []
        return [
            (
                "model",
                f"the model has {parameters:,} parameters ({nbytes / 2**20:,.1f} MiB in fp32); "
                f"{why} allows at most {self.parameters:,} parameters "
                f"({self.bytes / 2**20:,.1f} MiB)",
            )
        ]


def model_cap(tier: str, budget: Decimal) -> ModelCap:
    """The tier's ceiling (what its nodes can hold), scaled down for small budgets: a job
    pays for MODEL_PARAMS_PER_CREDIT parameters per credit of budget, never below the floor
    every job gets."""
    g = settings.GPUFLEX
    ceiling = int(g["MAX_MODEL_PARAMS"].get(tier, min(g["MAX_MODEL_PARAMS"].values())))
    paid = int(Decimal(g["MODEL_PARAMS_PER_CREDIT"]) * max(budget, Decimal(0)))
    params = min(ceiling, max(int(g["MODEL_PARAMS_FLOOR"]), paid))
    return ModelCap(parameters=params, bytes=params * BYTES_PER_PARAMETER)


def describe_cap(tier: str, budget: Decimal) -> str:
    return f"a {tier} job with a budget of {budget} credits"
