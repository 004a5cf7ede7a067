"""Bounds on a Hugging Face config.json read as plain JSON numbers, before any library builds it.

`transformers` builds what a config says, layer by layer in Python: a gpt2 config with n_embd
65536 and 1,000 layers took 35 s to measure even on the meta device, a llama config with
hidden_size 2^20 and 10,000 layers 270 s and 1.8 GB. These checks are arithmetic on the JSON
alone (microseconds): each size field within what any real model uses, and a lower bound on
the parameter count that the caller compares with its cap. What passes is still measured
exactly on the meta device, by a worker, in a child process (trainer/isolated.py).

The field names are those the `transformers` configs use for the same quantity; a config may
nest another (a multimodal model's `text_config`), so every mapping in it is checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# (the names of one quantity, the most any real model has; these are far above today's
# largest open models: 126 layers, hidden 16384, vocabulary 262144, 10M positions)
_GROUPS: dict[str, tuple[tuple[str, ...], int]] = {
    "layers": (("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
                "encoder_layers", "decoder_layers"), 512),
    "hidden": (("hidden_size", "n_embd", "d_model", "dim"), 32768),
    "intermediate": (("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim",
                      "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size"), 262144),
    "heads": (("num_attention_heads", "n_head", "num_heads", "num_key_value_heads",
               "encoder_attention_heads", "decoder_attention_heads"), 4096),
    "head_dim": (("head_dim", "d_kv"), 4096),
    "vocab": (("vocab_size",), 2**21),
    "positions": (("max_position_embeddings", "n_positions", "n_ctx"), 2**24),
    "experts": (("num_local_experts", "num_experts", "n_routed_experts"), 1024),
}  # fmt: skip
_FIELDS = {name: group for group, (names, _) in _GROUPS.items() for name in names}
# any other integer: a C int in the libraries that read it
_MAX_INT = 2**31 - 1


def _mappings(config: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping]]:
    yield path, config
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from _mappings(value, f"{path}{key}.")


def _number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def bound_problems(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each size in the config past what any real model has, the field
    named by its path in the config ("num_hidden_layers", "text_config.hidden_size")."""
    problems = []
    for path, mapping in _mappings(config):
        for key, value in mapping.items():
            group = _FIELDS.get(key)
            # a size may be written 4096.0; any other number is a float by right (rope_theta)
            number = _number(value) if group else value if type(value) is int else None
            if number is None:
                continue
            most = _GROUPS[group][1] if group else _MAX_INT
            if (group and number < 0) or abs(number) > most:
                problems.append((f"{path}{key}", f"{number} is outside 0..{most:,}"))
    return problems


def _get(mapping: Mapping[str, Any], group: str) -> int:
    for name in _GROUPS[group][0]:
        number = _number(mapping.get(name))
        if number is not None and number > 0:
            return number
    return 0


def least_parameters(config: Mapping[str, Any]) -> tuple[int, str]:
    """A lower bound on the parameters of the model the config describes, and the sizes it
    came from (to name in a refusal): the token embeddings (vocab × hidden), per layer an
    attention output projection (hidden × hidden, unless head_dim says otherwise) and an MLP
    of at least two hidden × intermediate matrices per expert. Every transformer has at least
    these; the measurement on the meta device counts everything."""
    best, said = 0, ""
    for path, mapping in _mappings(config):
        hidden = _get(mapping, "hidden")
        if not hidden:
            continue
        layers, vocab = _get(mapping, "layers"), _get(mapping, "vocab")
        inter, experts = _get(mapping, "intermediate"), max(1, _get(mapping, "experts"))
        attention = 0 if _get(mapping, "head_dim") else hidden * hidden
        total = vocab * hidden + layers * (attention + 2 * hidden * inter * experts)
        if total > best:
            parts = [("hidden", hidden), ("layers", layers), ("vocab", vocab),
                     ("intermediate", inter), ("experts", experts * (experts > 1))]  # fmt: skip
            named = [f"{path}{_name(mapping, group)} {n:,}" for group, n in parts if n]
            best, said = total, ", ".join(named)
    return best, said


def _name(mapping: Mapping[str, Any], group: str) -> str:
    return next((n for n in _GROUPS[group][0] if _number(mapping.get(n))), _GROUPS[group][0][0])
