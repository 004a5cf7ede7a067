"""The node's one speed figure, updated as its results are settled (the arithmetic is in
speed.py; docs/money.md, "Speed"). Sharding, sizing and billing read it off the node row
(nodes.selectors.speed_of); only this module writes it."""

from __future__ import annotations

from django.conf import settings

from marketplace.jobs.models import Job
from marketplace.ledger import speed
from marketplace.nodes.bounds import clean_benchmark
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.rounds.models import TaskResult

# the job's recent results its reference utilization is taken from (one bounded query)
PEER_WINDOW = 200
SPEED_FIELDS = ["speed_tflops", "speed_observed_tflops", "speed_tasks", "speed_flag"]


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


def state_of(node: Node) -> speed.Speed:
    """The node's speed state as its row holds it."""
    advertised = clean_benchmark(node.benchmark).get("fp32_tflops")
    return speed.Speed(advertised, node.speed_observed_tflops, node.speed_tasks,
                       node.speed_tflops, node.speed_flag)  # fmt: skip


def observe_speed(result: TaskResult) -> speed.Speed:
    """Fold this result's throughput into its node's speed and return the node's state after
    it (`figure` is what billing uses). The job's recent results (PEER_WINDOW, all nodes)
    give the reference utilization; with fewer than MIN_PEERS trusted nodes there, the
    node's figure stays as it was (from earlier jobs, or its benchmark). Every task settled
    while the node is flagged counts against its reliability."""
    g = settings.GPUFLEX
    # the row as it is now: the result's node instance may predate this round's other results
    node = Node.objects.only("benchmark", *SPEED_FIELDS).get(pk=result.node_id)
    state = state_of(node)
    task = result.task
    params = job_parameters(task.round.job)
    here = _achieved(params, task.steps, task.batch_size, result.compute_s)
    reference = _reference(task.round.job_id, params) if here is not None else None
    if reference is not None and here is not None:
        state = speed.fold(
            state, here / reference, prior_tasks=float(g["SPEED_PRIOR_TASKS"]),
            margin=float(g["SPEED_MARGIN"]), flag_tasks=int(g["SPEED_FLAG_TASKS"]),
        )  # fmt: skip
        Node.objects.filter(pk=node.pk).update(
            speed_tflops=state.figure, speed_observed_tflops=state.observed,
            speed_tasks=state.tasks, speed_flag=state.flag,
        )  # fmt: skip
    if state.figure is None:  # never observed: the benchmark is the figure (speed_of)
        state = speed.Speed(state.advertised, state.observed, state.tasks, state.advertised,
                            state.flag)  # fmt: skip
    if state.flagged:
        record_verification(node.pk, speed_mismatch=1)
    return state


def _reference(job_id: object, params: int) -> float | None:
    """The job's reference utilization over its last PEER_WINDOW results (one query): each
    trusted node's achieved over advertised; a flagged node's word is not counted."""
    rows = (
        TaskResult.objects.filter(task__round__job_id=job_id, compute_s__gt=0)
        .order_by("-pk")
        .values_list("node_id", "task__steps", "task__batch_size", "compute_s",
                     "node__benchmark", "node__speed_flag")[:PEER_WINDOW]
    )  # fmt: skip
    by_node: dict[int, list[float]] = {}
    for node_id, steps, batch, seconds, bench, flag in rows:
        achieved = _achieved(params, steps, batch, seconds) if not flag else None
        used = None
        if achieved is not None:
            used = speed.utilization(achieved, clean_benchmark(bench).get("fp32_tflops"))
        if used is not None:
            by_node.setdefault(node_id, []).append(used)
    return speed.reference_utilization(by_node)
