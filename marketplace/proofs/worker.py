"""The segment re-run, in the Celery worker (torch): marketplace.proofs.services says when."""

from __future__ import annotations

import logging

import torch
from django.conf import settings

from marketplace.jobs import files
from marketplace.jobs.models_io import load_model_file
from marketplace.proofs.models import CheckStatus, SegmentCheck
from marketplace.proofs.services import settle, skip
from trainer.datasets import Dataset
from trainer.lora import update_keys
from trainer.models import build_model
from trainer.proof import check_binding, check_segment, tolerance_for
from trainer.resume import PausedState, ResumeError
from trainer.schedule import round_lr
from trainer.updates import decode_state

VERIFIER = "platform-worker-cpu"
log = logging.getLogger(__name__)


def _shard_dataset(data: bytes, num_classes: int) -> Dataset:
    shard, _ = decode_state(data)
    x, y = shard["x"], shard["y"]
    lm = x.dtype == torch.int64 and y.dim() == 2
    return Dataset(
        name="shard", task="language_model" if lm else "classification", x_train=x, y_train=y,
        x_test=x[:0], y_test=y[:0], num_classes=256 if lm else num_classes,
        input_shape=tuple(int(d) for d in x.shape[1:]), lengths_train=shard.get("lengths"),
    )  # fmt: skip


def run_check(check_id: int) -> str:
    """Re-run the check's segment on this worker's CPU (fp32) and settle it. A failure of the
    verifier's own (a model it cannot build, no memory) is no verdict on the node: skipped."""
    try:
        return _run_check(check_id)
    except (RuntimeError, ValueError, KeyError, OSError, MemoryError) as exc:
        log.exception("segment check %s could not be re-run", check_id)
        skip(check_id, f"not re-run: {type(exc).__name__}: {exc}")
        return "skipped"


def _run_check(check_id: int) -> str:
    check = SegmentCheck.objects.select_related("result__task__round__job", "result__task__shard"
                                                ).get(pk=check_id)  # fmt: skip
    if check.status != CheckStatus.REVEALED:
        return check.status
    result, task = check.result, check.result.task
    job, rnd = task.round.job, task.round
    spec = job.parsed_spec
    try:
        states = {int(s): PausedState.from_bytes(files.get(name))
                  for s, name in check.revealed.items()}  # fmt: skip
    except ResumeError as exc:
        settle(check, False, f"a revealed checkpoint cannot be read: {exc}", verifier=VERIFIER)
        return "failed"
    scaled = [s for s, state in states.items() if state.meta.get("scaler")]
    if scaled and result.precision != "fp16":
        # fp16's loss scaler, committed to in the checkpoint: the claim is not what ran. (A
        # cheater that strips it is left to the segment's distance, see docs/verification.md)
        settle(check, False, f"checkpoint {scaled[0]} holds fp16 loss scaling; the upload "
               f"claims {result.precision}", verifier=VERIFIER)  # fmt: skip
        return "failed"
    global_state = load_model_file(rnd.input_model_file)
    update, _ = decode_state(files.get(result.update_file))
    bounds = check.boundaries
    first, last = states[bounds[0]], states[bounds[-1]]
    keys = update_keys(spec.model, global_state)
    problem = check_binding(first, last, global_state, {k: update[k] for k in keys if k in update})
    if problem is not None:
        settle(check, False, problem, verifier=VERIFIER)
        return "failed"
    if task.shard is None:  # a federated task's data never leaves its owner: nothing to re-run
        settle(check, True, "federated task: its chain is bound to the update; no re-run",
               verifier=VERIFIER)  # fmt: skip
        return "passed"
    dataset = _shard_dataset(files.get(task.shard.file), job.num_classes)
    model = build_model(spec.model, dataset.input_shape, dataset.num_classes, seed=spec.seed)
    cpu_spec = spec.replace(local=spec.local.model_dump(mode="json") | {"precision": "fp32"})
    start, end = states[bounds[check.segment]], states[bounds[check.segment + 1]]
    verdict = check_segment(
        model, start, end, dataset, cpu_spec, seed=task.seed, steps=bounds[-1],
        tolerance=tolerance_for(result.precision, "fp32", result.device == "cpu",
                                settings.GPUFLEX["AGREEMENT_TOLERANCE"]),
        batch_size=task.batch_size, proximal_mu=job.proximal_mu,
        lr=round_lr(spec, rnd.number), global_state=global_state,
    )  # fmt: skip
    d = verdict.distance.relative_l2
    settle(
        check, verdict.ok,
        f"segment {check.segment} re-run at relative L2 {d:.3g} (tolerance {verdict.tolerance:g})",
        distance=d, tolerance=verdict.tolerance, rerun_steps=verdict.steps, verifier=VERIFIER,
    )  # fmt: skip
    return "passed" if verdict.ok else "failed"
