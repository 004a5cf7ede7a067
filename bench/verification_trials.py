"""Honest replicas and cheats of real tasks, compared by the marketplace's own rule.

Each trial trains one shard's task of a digits job (the MLP and the CNN of examples/) through
train_local, the product's path, in fp32, bf16 and fp16 autocast, and makes the int8 round trip
a replicated task's upload makes. Honest pairs are the same task in two precisions (and fp32
against fp64, fp32's own rounding: a stand-in for fp32 on another device); cheats are what a
lazy or malicious node uploads instead, each against an honest replica, claiming whichever
precision class helps it (trainer.replicas.agreement gives a different claim the wider,
cross-device tolerance). Seeds vary the model's start, and some trials start from a model
after a few FedAvg rounds, so the distances are not those of one task.

The cheats (bench/verification_bench.py names them as issue #35 does):
  copy             another shard's honest update of the same round
  stale            the same shard's honest update of the previous round
  noise            Gaussian noise of the honest update's norm
  sign_flip        the honest update negated
  scaled           the honest update times 0.5 or times 2 (each is a trial)
  half_steps       the task trained honestly for half its steps
  wrong_shard      the task's seed and steps, trained on another shard's data
  precision_claim  trained in fp16, claimed as fp32
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from bench.replica_divergence import SHARDS, train, train_fp64, travel
from trainer.datasets import Dataset, load_digits_dataset
from trainer.local import derive_seed, planned_steps
from trainer.models import build_model
from trainer.replicas import SAME_DEVICE_TOLERANCE, agreement
from trainer.sharding import plan_shards
from trainer.spec import JobSpec, parse_spec

CHEATS = ("copy", "stale", "noise", "sign_flip", "scaled", "half_steps", "wrong_shard",
          "precision_claim")  # fmt: skip
MODELS = {
    "mlp": {"model": {"arch": "mlp", "hidden": [128]}, "optimizer": {"name": "sgd", "lr": 0.2}},
    "cnn": {
        "model": {"arch": "cnn", "channels": [16, 32]},
        "optimizer": {"name": "sgd", "lr": 0.1},
    },
}


@dataclass(frozen=True)
class Comparison:
    model: str
    seed: int
    round: int
    shard: int
    what: str  # "honest fp32/bf16", ... or a cheat's name
    claims: tuple[str, str]
    relative_l2: float
    agreed: bool  # by the marketplace's default rule (cross-device tolerance)
    agreed_same_device: bool  # by SAME_DEVICE_TOLERANCE for same claims (a homogeneous fleet)
    cheat: bool


def _spec(model: str, seed: int) -> JobSpec:
    return parse_spec({"name": f"verify-{model}", "seed": seed,
                       "local": {"epochs": 1, "batch_size": 32}} | MODELS[model])  # fmt: skip


def _compare(a: Mapping[str, Tensor], b: Mapping[str, Tensor], claim_a: str, claim_b: str):
    loose = agreement(a, b, claim_a, claim_b)
    tight = agreement(a, b, claim_a, claim_b, same_class_tolerance=SAME_DEVICE_TOLERANCE)
    return loose.distance.relative_l2, loose.agreed, tight.agreed


def trials(model_name: str, seeds: range, rounds: int = 2) -> Iterator[Comparison]:
    """Every honest pair and every cheat for each seed, shard and round (0 .. rounds-1)."""
    data = load_digits_dataset(0.2, 0)
    shards = [data.subset(torch.from_numpy(s.indices))
              for s in plan_shards(data, SHARDS, "stratified", seed=0)]  # fmt: skip
    for seed in seeds:
        spec = _spec(model_name, seed)
        model = build_model(spec.model, data.input_shape, data.num_classes, seed=seed)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        previous: list[dict[str, Tensor]] | None = None
        gen = torch.Generator().manual_seed(seed)
        for rnd in range(rounds):
            task_seeds = [derive_seed(seed, rnd, s) for s in range(SHARDS)]
            fp32 = [train(model, state, shards[s], spec, task_seeds[s], "fp32")
                    for s in range(SHARDS)]  # fmt: skip
            for s in range(SHARDS):
                yield from _shard_trials(model_name, seed, rnd, s, model, state, shards, spec,
                                         task_seeds, fp32, previous, gen, data)  # fmt: skip
            previous = fp32
            mean = {k: sum(d[k] for d in fp32) / SHARDS for k in state}
            state = {k: state[k] + mean[k] for k in state}


def _shard_trials(
    model_name: str, seed: int, rnd: int, s: int, model: torch.nn.Module,
    state: dict[str, Tensor], shards: list[Dataset], spec: JobSpec, task_seeds: list[int],
    fp32: list[dict[str, Tensor]], previous: list[dict[str, Tensor]] | None,
    gen: torch.Generator, data: Dataset,
) -> Iterator[Comparison]:  # fmt: skip
    other = (s + 1) % SHARDS
    honest = {"fp32": fp32[s]}
    honest["bf16"] = train(model, state, shards[s], spec, task_seeds[s], "bf16")
    honest["fp16"] = train(model, state, shards[s], spec, task_seeds[s], "fp16")
    sent = {k: travel(v, state) for k, v in honest.items()}
    wide = travel(train_fp64(spec, state, shards[s], task_seeds[s]), state)

    def row(what: str, a: str, b: str, upload: Mapping[str, Tensor], cheat: bool) -> Comparison:
        dist, loose, tight = _compare(sent[a], upload, a, b)
        return Comparison(model_name, seed, rnd, s, what, (a, b), dist, loose, tight, cheat)

    for a, b in (("fp32", "bf16"), ("fp32", "fp16"), ("bf16", "fp16")):
        yield row(f"honest {a}/{b}", a, b, sent[b], False)
    yield row("honest fp32/fp64", "fp32", "fp32", wide, False)

    steps = planned_steps(spec, shards[s].num_train)
    cheats: list[tuple[str, dict[str, Tensor], str]] = [
        ("copy", fp32[other], "bf16"),
        ("noise", _noise(honest["fp32"], gen), "bf16"),
        ("sign_flip", {k: -v for k, v in honest["fp32"].items()}, "bf16"),
        ("scaled", {k: 0.5 * v for k, v in honest["fp32"].items()}, "bf16"),
        ("scaled", {k: 2.0 * v for k, v in honest["fp32"].items()}, "bf16"),
        ("half_steps",
         train(model, state, shards[s], spec, task_seeds[s], "fp32", steps=max(1, steps // 2)),
         "bf16"),
        ("wrong_shard", train(model, state, shards[other], spec, task_seeds[s], "fp32"), "bf16"),
        ("precision_claim", honest["fp16"], "fp32"),  # the fp16 run, claimed as fp32
    ]  # fmt: skip
    if previous is not None:
        cheats.append(("stale", previous[s], "bf16"))
    for name, fake, claim in cheats:
        upload = travel(fake, state)
        # against the honest fp32 replica: the cheater claims the class that widens the rule
        yield row(name, "fp32", claim, upload, True)


def _noise(update: Mapping[str, Tensor], gen: torch.Generator) -> dict[str, Tensor]:
    out = {}
    for k, v in update.items():
        z = torch.randn(v.shape, generator=gen)
        out[k] = z * (v.norm() / z.norm().clamp_min(1e-30))
    return out
