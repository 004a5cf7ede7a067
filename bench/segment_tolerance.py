"""How far an honest segment re-run lands from the committed one, and how far cheats land
(trainer.proof's rule): digits MLP and CNN, SGD and Adam, a 16-step task of 4 segments, from
the initial model; every segment re-run on this CPU in fp32 against a prover that ran fp32,
bf16 or fp16, and a prover that ran half the steps or another shard.

    python -m bench.segment_tolerance
"""

from __future__ import annotations

import itertools
import json

import torch

from trainer.datasets import load_dataset
from trainer.local import _can_autocast, train_local
from trainer.models import build_model
from trainer.proof import boundaries, rerun_segment, segment_distance
from trainer.resume import PausedState
from trainer.spec import parse_spec

STEPS = 16


def _spec(arch: str, optimizer: str, precision: str):
    model = {"arch": "mlp", "hidden": [64], "dropout": 0.1} if arch == "mlp" else {"arch": "cnn"}
    return parse_spec({
        "name": "t", "model": model,
        "optimizer": {"name": optimizer, "lr": 0.05 if optimizer == "sgd" else 0.005,
                      "momentum": 0.9 if optimizer == "sgd" else 0},
        "local": {"steps": STEPS, "batch_size": 32, "precision": precision},
    })  # fmt: skip


def _chain(data, spec, shard, steps, model_seed: int = 0):
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=model_seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    kept: list[PausedState] = []
    train_local(model, state, shard, spec, seed=5, steps=steps, checkpoints=boundaries(steps),
                on_checkpoint=kept.append)  # fmt: skip
    return kept


def main() -> None:
    data = load_dataset(parse_spec({"name": "t"}).dataset)
    shard, other = data.subset(torch.arange(400)), data.subset(torch.arange(400, 800))
    precisions = ["fp32"] + [p for p, d in (("bf16", torch.bfloat16), ("fp16", torch.float16))
                             if _can_autocast("cpu", d)]  # fmt: skip
    rows = []
    for arch, opt in itertools.product(("mlp", "cnn"), ("sgd", "adam")):
        verifier = _spec(arch, opt, "fp32")
        cases = {f"honest_{p}": _chain(data, _spec(arch, opt, p), shard, STEPS)
                 for p in precisions}  # fmt: skip
        half = _chain(data, verifier, shard, STEPS // 2)
        claimed = boundaries(STEPS)
        cases["half_steps"] = [
            PausedState(b, s.tensors, s.meta) for b, s in zip(claimed, half, strict=True)
        ]
        cases["wrong_shard"] = _chain(data, verifier, other, STEPS)
        for case, chain in cases.items():
            dists = []
            for start, end in itertools.pairwise(chain):
                model = build_model(verifier.model, data.input_shape, data.num_classes, seed=0)
                reached = rerun_segment(model, start, end.step, shard, verifier, seed=5,
                                        steps=STEPS)  # fmt: skip
                dists.append(segment_distance(start, end, reached).relative_l2)
            rows.append({"model": arch, "optimizer": opt, "prover": case,
                         "max": max(dists), "min": min(dists)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
