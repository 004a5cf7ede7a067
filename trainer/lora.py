"""LoRA fine-tuning: low-rank adapters (through `peft`) on a frozen base model.

Only the adapters train, and only they travel: a node's update holds the adapter tensors
alone (`update_keys`), the server aggregates those and adds them to the global model's
adapters, and the base weights stay as they came (from the buyer's checkpoint, or the seed).
The FedAvg of the A and B factors separately is the usual federated LoRA rule (FedIT); it is
not the average of the products B·A, which is why a round's adapters are an average of
factors, not of weight changes.

`update_keys` is a rule on tensor names and needs neither torch nor peft: the agent, the
server and the trainer all call it with the global model's names. peft's names are stable:
`...lora_A.<adapter>.weight`, `...lora_B.<adapter>.weight`, and `...modules_to_save.<adapter>.*`
for the modules peft trains whole (a sequence classifier's new head).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from trainer.spec import LoraSpec, ModelSpec

_TRAINED = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.",
            ".modules_to_save.")  # fmt: skip

T = TypeVar("T")


class LoraError(ValueError):
    """The LoRA section does not fit the model (said in the message)."""


def is_adapter_key(name: str) -> bool:
    return any(part in name for part in _TRAINED)


def update_keys(spec: ModelSpec, names: Iterable[str]) -> list[str]:
    """The names of the global model's tensors that an update carries: all of them, or for
    a LoRA model only the adapters (and the modules peft trains whole)."""
    names = list(names)
    if spec.lora is None:
        return names
    return [n for n in names if is_adapter_key(n)]


def update_part(spec: ModelSpec, state: Mapping[str, T]) -> dict[str, T]:
    """The part of `state` an update carries (`update_keys`): the reference an update is
    checked against, on the node before it is sent and on the server when it arrives."""
    return {k: state[k] for k in update_keys(spec, state)}


def apply_lora(model: Any, spec: LoraSpec, task_type: str) -> Any:
    """`model` (a transformers model) wrapped by peft with fresh adapters from the current
    torch RNG; every base weight frozen. `task_type`: "CAUSAL_LM" or "SEQ_CLS" (peft then
    also trains the classifier head whole)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules) if spec.target_modules else None,
        task_type=task_type,
    )
    try:
        return get_peft_model(model, config)
    except (ValueError, KeyError) as exc:
        raise LoraError(f"LoRA cannot adapt this model: {exc}") from None
