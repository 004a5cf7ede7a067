"""Celery queues: aggregation has a queue of its own, so that a big job's aggregation cannot
starve the periodic tick (reclaiming leases, closing overdue rounds) and settlement, which stay
on the default queue.

The aggregation queue's name is derived from the default queue as the message is sent, so a
deployment (or a test) that renames the default queue with GPUFLEX_CELERY_QUEUE moves both.
Nothing here imports Django: `gpuflex worker` reads the names before any settings load.
"""

from __future__ import annotations

import os
from typing import Any

AGGREGATE_ROUND = "marketplace.jobs.tasks.aggregate_round"  # its historical name
# building a submitted job's model is the same kind of heavy work (jobs/preparation.py)
PREPARE_JOB = "marketplace.jobs.tasks.prepare_job"
# a sweep's step submits its next trials, loading their dataset as a submission does
ADVANCE_SWEEP = "marketplace.sweeps.tasks.advance_sweep"
# a proof of learning's segment re-run (marketplace.proofs): training, however short
RUN_SEGMENT_CHECK = "marketplace.proofs.tasks.run_segment_check"
# an upload's check against the round's model (marketplace.rounds.update_checks): torch
CHECK_UPDATE = "marketplace.rounds.tasks.check_update"
# a zone aggregator's partial sum, checked the same way (marketplace.rounds.zone_checks)
CHECK_PARTIAL = "marketplace.rounds.tasks.check_partial"
# a model's onnx / torchscript / hf export (jobs/export_making.py): built and traced with torch
EXPORT_MODEL = "marketplace.jobs.tasks.export_model"
HEAVY = (
    AGGREGATE_ROUND, PREPARE_JOB, ADVANCE_SWEEP, RUN_SEGMENT_CHECK, CHECK_UPDATE, CHECK_PARTIAL,
    EXPORT_MODEL,
)  # fmt: skip
KINDS = ("all", "maintenance", "aggregation")


def default_queue() -> str:
    return os.environ.get("GPUFLEX_CELERY_QUEUE", "gpuflex")


def aggregation_queue(default: str) -> str:
    return f"{default}.aggregation"


def worker_queues(kind: str = "all", default: str | None = None) -> list[str]:
    """The queues a `gpuflex worker --queues KIND` consumes."""
    default = default or default_queue()
    return {
        "all": [default, aggregation_queue(default)],
        "maintenance": [default],
        "aggregation": [aggregation_queue(default)],
    }[kind]


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any):
    """Celery's router (CELERY_TASK_ROUTES): the heavy tasks (HEAVY: aggregation, job
    preparation, model exports, ...) to the aggregation queue, the rest default."""
    if name not in HEAVY:
        return None
    from celery import current_app

    return {"queue": aggregation_queue(current_app.conf.task_default_queue)}
