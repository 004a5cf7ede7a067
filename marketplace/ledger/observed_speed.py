"""The node's observed speed, updated as its results are settled, and the figure billing uses
(the arithmetic is in speed.py; docs/money.md, "Speed")."""

from __future__ import annotations

from django.conf import settings

from marketplace.jobs.models import Job
from marketplace.ledger import speed
from marketplace.nodes.bounds import clean_benchmark
from marketplace.nodes.models import NodeSpeed
from marketplace.nodes.selectors import benchmark_of
from marketplace.nodes.services import record_verification
from marketplace.rounds.models import TaskResult

# the job's recent results its reference utilization is taken from (one bounded query)
PEER_WINDOW = 200


# job id -> parameters: a job's model never changes (bounded: cleared when it grows large)
_PARAMS: dict[object, int] = {}


def job_parameters(job: Job) -> int:
    """The job's model's parameter count (built on the meta device, once per job and
    process); 0 when it cannot be measured (then nothing is judged)."""
    from trainer.models import ModelSpecError, model_size

    if job.pk in _PARAMS:
        return _PARAMS[job.pk]
    params = 0
    if job.input_shape:
        spec = job.parsed_spec
        # a language model's inputs are token ids: the float probe fails on its embedding
        for integer_input in (False, True):
            try:
                shape = tuple(job.input_shape)
                params = model_size(spec.model, shape, job.num_classes, integer_input)[0]
                break
            except (ModelSpecError, RuntimeError, ValueError, IndexError):
                continue
    if len(_PARAMS) > 1024:
        _PARAMS.clear()
    _PARAMS[job.pk] = params
    return params


def _achieved(params: int, steps: int | None, batch: int | None, seconds: float) -> float | None:
    return speed.achieved_tflops(params, (steps or 0) * (batch or 0), seconds)


def observe_speed(result: TaskResult) -> speed.SpeedVerdict:
    """Fold this result's throughput into its node's observed speed and say what billing
    uses. The result's job's recent results (PEER_WINDOW, all nodes) give the reference
    utilization; with fewer than MIN_PEERS nodes judged there, the node's figure stays as it
    was (from earlier jobs, or none). A task whose figure is past the margin counts against
    the node's reliability."""
    node = result.node
    task = result.task
    job = task.round.job
    margin = float(settings.GPUFLEX["SPEED_MARGIN"])
    advertised = benchmark_of(node).get("fp32_tflops")
    params = job_parameters(job)
    here = _achieved(params, task.steps, task.batch_size, result.compute_s)
    reference = _reference(job, params) if here is not None else None
    row = NodeSpeed.objects.filter(node=node).first()
    if reference is None or here is None:  # nothing to judge: the figure stands as it was
        return speed.verdict(advertised, row.observed_tflops if row else None, margin)
    row = row or NodeSpeed(node=node)
    row.observed_tflops = speed.ema(row.observed_tflops, speed.observed_tflops(here, reference))
    row.achieved_tflops = here
    row.tasks += 1
    v = speed.verdict(advertised, row.observed_tflops, margin)
    row.advertised_tflops, row.billed_tflops = advertised, v.billed
    row.mismatch, row.note = v.mismatch, v.note()[:300]
    row.save()
    if v.mismatch:
        record_verification(node.pk, speed_mismatch=1)
    return v


def _reference(job: Job, params: int) -> float | None:
    """The job's reference utilization over its last PEER_WINDOW results (one query)."""
    rows = (
        TaskResult.objects.filter(task__round__job=job, compute_s__gt=0)
        .order_by("-pk")
        .values_list("node_id", "task__steps", "task__batch_size", "compute_s",
                     "node__benchmark")[:PEER_WINDOW]
    )  # fmt: skip
    by_node: dict[int, list[float]] = {}
    for node_id, steps, batch, seconds, bench in rows:
        achieved = _achieved(params, steps, batch, seconds)
        used = None
        if achieved is not None:
            used = speed.utilization(achieved, clean_benchmark(bench).get("fp32_tflops"))
        if used is not None:
            by_node.setdefault(node_id, []).append(used)
    return speed.reference_utilization(by_node)
