"""Segment checks of real tasks (trainer.proof), many seeds: how far an honest prover's
committed segment lands from the verifier's re-run, and how often a lazy chain is caught.

The verifier is what the marketplace runs (marketplace/proofs/worker.py): the segment re-run
on a CPU in fp32 from the prover's checkpoint. Provers: honest in fp32, bf16 and fp16; one
that trained half the steps and states the task's boundaries (`half_steps`); one that trained
on another part of the data (`wrong_shard`). A check re-runs one segment drawn at random, so
a chain is caught by a check with the share of its segments beyond the tolerance.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bench.segment_tolerance import STEPS, _chain, _spec
from trainer.datasets import load_dataset
from trainer.local import _can_autocast
from trainer.models import build_model
from trainer.proof import boundaries, rerun_segment, segment_distance, tolerance_for
from trainer.resume import PausedState
from trainer.spec import parse_spec


@dataclass(frozen=True)
class SegmentTrial:
    model: str
    optimizer: str
    shard: int
    prover: str  # honest_fp32, honest_bf16, honest_fp16, half_steps, wrong_shard
    distances: tuple[float, ...]  # one per segment
    tolerance: float

    @property
    def cheat(self) -> bool:
        return not self.prover.startswith("honest")

    @property
    def caught_share(self) -> float:
        """The chance a check (one segment drawn) rejects this chain."""
        return sum(d > self.tolerance for d in self.distances) / len(self.distances)


def trials(shards: int = 4) -> Iterator[SegmentTrial]:
    data = load_dataset(parse_spec({"name": "t"}).dataset)
    size = data.num_train // (shards + 1)
    parts = [data.subset(torch.arange(i * size, (i + 1) * size)) for i in range(shards + 1)]
    precisions = ["fp32"] + [p for p, d in (("bf16", torch.bfloat16), ("fp16", torch.float16))
                             if _can_autocast("cpu", d)]  # fmt: skip
    for arch, opt in itertools.product(("mlp", "cnn"), ("sgd", "adam")):
        verifier = _spec(arch, opt, "fp32")
        for s in range(shards):
            shard, other = parts[s], parts[s + 1]
            cases = {f"honest_{p}": (_chain(data, _spec(arch, opt, p), shard, STEPS), p)
                     for p in precisions}  # fmt: skip
            half = _chain(data, verifier, shard, STEPS // 2)
            claimed = boundaries(STEPS)
            cases["half_steps"] = (
                [PausedState(b, c.tensors, c.meta) for b, c in zip(claimed, half, strict=True)],
                "fp32",
            )
            cases["wrong_shard"] = (_chain(data, verifier, other, STEPS), "fp32")
            for prover, (chain, precision) in cases.items():
                dists = []
                for start, end in itertools.pairwise(chain):
                    model = build_model(verifier.model, data.input_shape, data.num_classes,
                                        seed=0)  # fmt: skip
                    reached = rerun_segment(model, start, end.step, shard, verifier, seed=5,
                                            steps=STEPS)  # fmt: skip
                    dists.append(segment_distance(start, end, reached).relative_l2)
                # the worker's rule: a CPU in fp32 against what the prover claims
                tol = tolerance_for(precision, "fp32", same_device=False)
                yield SegmentTrial(arch, opt, s, prover, tuple(dists), tol)


BINDING_CHEATS = ("copy", "stale", "noise", "sign_flip", "scaled")


def binding_trials(shards: int = 4, seed: int = 0) -> Iterator[tuple[str, bool]]:
    """(cheat, caught) for uploads that are not the committed chain's end: the worker checks
    that the last checkpoint less the round's model is the uploaded update
    (trainer.proof.check_binding), whatever segment it re-runs. `stale`: the update of the
    same data from another round's model (another initial model here)."""
    from trainer.proof import check_binding, weights

    data = load_dataset(parse_spec({"name": "t"}).dataset)
    size = data.num_train // (shards + 1)
    parts = [data.subset(torch.arange(i * size, (i + 1) * size)) for i in range(shards + 1)]
    gen = torch.Generator().manual_seed(seed)
    for arch, opt in itertools.product(("mlp", "cnn"), ("sgd", "adam")):
        spec = _spec(arch, opt, "fp32")
        for s in range(shards):
            chain = _chain(data, spec, parts[s], STEPS)
            other = _chain(data, spec, parts[s + 1], STEPS)
            start, last = weights(chain[0]), weights(chain[-1])
            honest = {k: last[k] - start[k] for k in last if last[k].is_floating_point()}
            moved = {k: weights(other[-1])[k] - weights(other[0])[k] for k in honest}
            earlier = _chain(data, spec, parts[s], STEPS, model_seed=1 + s)
            stale = {k: weights(earlier[-1])[k] - weights(earlier[0])[k] for k in honest}
            fakes = {
                "copy": moved,
                "stale": stale,
                "noise": {k: torch.randn(v.shape, generator=gen) * v.norm()
                          / max(v.numel(), 1) ** 0.5 for k, v in honest.items()},
                "sign_flip": {k: -v for k, v in honest.items()},
                "scaled": {k: 2.0 * v for k, v in honest.items()},
            }  # fmt: skip
            yield "honest", check_binding(chain[0], chain[-1], start, honest) is not None
            for name, fake in fakes.items():
                yield name, check_binding(chain[0], chain[-1], start, fake) is not None
