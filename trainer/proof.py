"""Proof of learning, checked one segment at a time: cheaper checks for lazy work (issue 35).

A task commits, as it trains, to its state at K+1 step boundaries (`boundaries`: 0, ..., the
task's steps), each a paused-run state (trainer.resume) hashed by
trainer.proof_commitment.commitment. After the upload the server picks one segment j at
random (so the node cannot know which one when it trains), has the node reveal checkpoints 0,
j, j+1 and K, checks them against the commitments, and has a verifier re-run steps b_j..b_{j+1}
from checkpoint j (`check_segment`). The re-run costs 1/K of the task instead of a whole
replica.

What binds the chain to the work: checkpoint 0's weights are the round's global model, and
the last checkpoint's weights minus the global model are the uploaded update (`check_binding`);
every segment then has to be the training it claims to be. A node that trains half the steps
and fabricates the rest fails every fabricated segment it is asked about: with f of K segments
fabricated, a spot check catches it with probability f/K.

The rule, measured by bench/segment_tolerance.py (digits MLP and CNN, SGD and Adam, a 16-step
task of 4 segments from the initial model, every segment re-run on one CPU in fp32), as the
relative L2 distance between the segment's displacements, reached weights minus the start
weights against the committed end's minus the same start:

    prover fp32, same device                           0 (identical bits), every segment
    prover bf16 (CPU autocast), re-run fp32            MLP 0.0010-0.022, CNN 0.013-0.155
    prover fp16 (CPU autocast), re-run fp32            MLP 0.0001-0.004, CNN 0.002-0.041
    half the steps, the task's boundaries claimed      0.47-0.73
    another part of the shard (wrong_shard)            0.38-0.97

so a segment is held to trainer.replicas' CROSS_DEVICE_TOLERANCE (0.25, 1.6x the largest honest
distance, 1.5x below the smallest cheat), as replicas are: a deployment whose fleet is one kind
of device lowers the same-class bound (AGREEMENT_TOLERANCE) to SAME_DEVICE_TOLERANCE, where
identical bits are expected, and then also catches some fp16 runs that claim fp32 (above: not
the MLP's smallest). Not measured here: GPUs (TF32, other kernels), CPUs of other makes,
longer segments, trained models; a fleet of those has to be measured before lowering anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from trainer.datasets import Dataset
from trainer.local import resolve_precision, run_identity, train_local
from trainer.replicas import CROSS_DEVICE_TOLERANCE, Distance, distance
from trainer.resume import PausedState
from trainer.spec import JobSpec

_MODEL = "model/"
# a task's boundaries: K segments (K+1 states). 4 keeps a check at a quarter of the task and a
# fabricated half caught on half the checks; more segments cost the node more disk, not more pay
DEFAULT_SEGMENTS = 4
# the last checkpoint minus the global model against the uploaded update: the int8 codec's
# rounding (0.007 relative L2 on Gaussian updates, measured) and nothing else; a scaled update
# (x0.5, x2) is 0.5 away
BINDING_TOLERANCE = 0.02


def boundaries(steps: int, k: int = DEFAULT_SEGMENTS) -> list[int]:
    """K+1 strictly increasing step counts from 0 to `steps`, as even as whole steps allow
    (fewer segments when the task has fewer than K steps)."""
    if steps < 1:
        raise ValueError(f"a task of {steps} steps has no segments")
    k = max(1, min(k, steps))
    return [round(i * steps / k) for i in range(k + 1)]


def weights(state: PausedState) -> dict[str, torch.Tensor]:
    """The model's tensors in a checkpoint (its state_dict, buffers included)."""
    return {k[len(_MODEL) :]: v for k, v in state.tensors.items() if k.startswith(_MODEL)}


def _floating(a: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in a.items() if v.is_floating_point()}


def _minus(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: a[k].double() - b[k].double() for k in a}


@dataclass(frozen=True)
class SegmentVerdict:
    ok: bool
    distance: Distance  # reached - start against committed end - start, relative L2
    tolerance: float
    steps: int  # steps re-run: the verification's compute, against the task's steps
    precision: str  # what the verifier ran


def tolerance_for(
    prover_precision: str, verifier_precision: str, same_device: bool,
    same_class_tolerance: float = CROSS_DEVICE_TOLERANCE,
) -> float:  # fmt: skip
    """The bound a segment's distance is held to, by trainer.replicas' policy: a prover that
    claims the verifier's precision on the same kind of device is held to
    `same_class_tolerance` (the deployment's AGREEMENT_TOLERANCE: by default the cross-device
    one, since two CPUs of other makes already sum differently; SAME_DEVICE_TOLERANCE for a
    fleet known to be homogeneous), any other to at least CROSS_DEVICE_TOLERANCE."""
    if same_device and prover_precision == verifier_precision:
        return same_class_tolerance
    return max(CROSS_DEVICE_TOLERANCE, same_class_tolerance)


class _Reached(Exception):
    def __init__(self, state: PausedState) -> None:
        super().__init__(state.step)
        self.state = state


def rerun_segment(
    model: nn.Module, start: PausedState, end_step: int, data: Dataset, spec: JobSpec, *,
    seed: int, steps: int, batch_size: int | None = None, proximal_mu: float = 0.0,
    lr: float | None = None, global_state: Mapping[str, torch.Tensor] | None = None,
) -> PausedState:  # fmt: skip
    """Train from checkpoint `start` to step `end_step` of the task (`steps` in all, `seed`
    its training seed) and return the state reached. The checkpoint's own metadata is not
    trusted: the run is this verifier's, as train_local would run the task here."""
    if not start.step < end_step <= steps:
        raise ValueError(f"a segment from step {start.step} to {end_step} of a {steps}-step task")
    device = next(model.parameters()).device
    precision = resolve_precision(spec.local.precision, device)
    batch = batch_size or spec.local.batch_size
    identity = run_identity(seed, steps, batch, spec.local.grad_accum_steps, data.num_train,
                            precision, proximal_mu,
                            spec.optimizer.lr if lr is None else lr)  # fmt: skip
    meta = dict(start.meta, identity=identity)
    if start.meta.get("identity", {}).get("precision") != precision:
        meta["scaler"] = None  # another precision's loss scale means nothing here
    mine = PausedState(start.step, start.tensors, meta)
    # train_local loads the global state first (FedProx's anchor); the checkpoint's weights
    # then replace it
    global_state = weights(start) if global_state is None else global_state

    def reached(state: PausedState) -> None:
        raise _Reached(state)

    try:
        train_local(
            model, global_state, data, spec, seed=seed, steps=steps, batch_size=batch,
            proximal_mu=proximal_mu, lr=lr, resume=mine, checkpoints=(end_step,),
            on_checkpoint=reached,
        )  # fmt: skip
    except _Reached as done:
        return done.state
    raise AssertionError("train_local ended without reaching the segment's end")


def segment_distance(start: PausedState, end: PausedState, reached: PausedState) -> Distance:
    """How far the re-run's displacement is from the committed one (floating weights only)."""
    w0 = _floating(weights(start))
    return distance(
        _minus({k: weights(reached)[k] for k in w0}, w0),
        _minus({k: weights(end)[k] for k in w0}, w0),
    )


def check_segment(
    model: nn.Module, start: PausedState, end: PausedState, data: Dataset, spec: JobSpec, *,
    seed: int, steps: int, tolerance: float, batch_size: int | None = None,
    proximal_mu: float = 0.0, lr: float | None = None,
    global_state: Mapping[str, torch.Tensor] | None = None,
) -> SegmentVerdict:  # fmt: skip
    """Re-run the segment from `start` to `end.step` and hold the displacement it reaches to
    the committed `end`'s within `tolerance` (`tolerance_for`)."""
    if weights(start).keys() != weights(end).keys():
        raise ValueError("the segment's checkpoints hold different tensors")
    reached = rerun_segment(model, start, end.step, data, spec, seed=seed, steps=steps,
                            batch_size=batch_size, proximal_mu=proximal_mu, lr=lr,
                            global_state=global_state)  # fmt: skip
    d = segment_distance(start, end, reached)
    precision = reached.meta["identity"]["precision"]
    return SegmentVerdict(d.relative_l2 <= tolerance, d, tolerance, end.step - start.step,
                          precision)  # fmt: skip


def check_binding(
    first: PausedState | None, last: PausedState | None,
    global_state: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor],
) -> str | None:  # fmt: skip
    """Why the chain is not the upload's (None when it is): checkpoint 0 must be the round's
    global model, and the last checkpoint minus the global model the uploaded `update` (the
    tensors it carries; within the codec's rounding). Either may be None when not revealed."""
    if first is not None:
        w = weights(first)
        for k, v in global_state.items():
            if k not in w or w[k].shape != v.shape or not torch.equal(w[k].to(v.dtype), v.cpu()):
                return f"checkpoint 0 is not the round's model (tensor {k!r})"
    if last is not None:
        w = weights(last)
        missing = [k for k in update if k not in w or k not in global_state]
        if missing:
            return f"the last checkpoint lacks tensors of the update: {missing[:3]}"
        moved = _minus({k: w[k] for k in update}, {k: global_state[k].cpu() for k in update})
        d = distance(moved, {k: v.double() for k, v in update.items()}).relative_l2
        if d > BINDING_TOLERANCE:
            return (f"the last checkpoint minus the round's model is {d:.3g} (relative L2) from "
                    f"the uploaded update; at most {BINDING_TOLERANCE} is rounding")  # fmt: skip
    return None
