"""Reads for rounds and tasks: a job's rounds, what each node did for it, and what a node has
done."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from marketplace.jobs.errors import NotFound
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import ReceivedUpdate, RefusedUpdate, Round, Task, TaskResult


def rounds_of(job: Job) -> QuerySet[Round]:
    return Round.objects.filter(job=job).order_by("number")


def node_work(job: Job) -> list[dict]:
    """Per node, what it did for this job: results accepted, samples and compute seconds.
    The job page's per-node table and share-of-work column read it."""
    rows = (
        TaskResult.objects.filter(task__round__job=job)
        .values("node_id")
        .annotate(
            results=Count("pk"),
            accepted=Count("pk", filter=Q(accepted=True)),
            samples=Sum("num_samples"),
            compute_s=Sum("compute_s"),
        )
        .order_by("node_id")
    )
    return list(rows)


def leased_nodes(job: Job) -> set[int]:
    """Nodes holding a live lease on this job now: the ones working on it at this moment."""
    return set(
        Task.objects.filter(round__job=job, status="leased", node__isnull=False).values_list(
            "node_id", flat=True
        )
    )


def tasks_done_by_node(nodes: QuerySet[Node]) -> dict[int, int]:
    """Accepted results per node, for the provider's "tasks done" column."""
    rows = (
        TaskResult.objects.filter(node__in=nodes, accepted=True)
        .values("node_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {r["node_id"]: r["n"] for r in rows}


def upload_outcome(node: Node, task_id: object) -> dict[str, Any]:
    """What became of this node's upload for the task (the agent's GET agent/tasks/<id>/update):
    `checking` while the worker has yet to check it, `accepted`, or `refused` with the
    reason. A refused upload's task has forgotten its node (it went back to the queue), so
    the answer comes from the node's own rows; another node's task, or one it uploaded
    nothing for, is NotFound, as for every agent path."""
    try:
        pk = uuid.UUID(str(task_id))
    except ValueError:
        pk = None
    mine = {"task_id": pk, "node": node}
    if pk is not None:
        if result := TaskResult.objects.filter(**mine).only("update_hash").first():
            return {"status": "accepted", "update_hash": result.update_hash, "reason": ""}
        if received := ReceivedUpdate.objects.filter(**mine).only("update_hash").first():
            return {"status": "checking", "update_hash": received.update_hash, "reason": ""}
        refused = RefusedUpdate.objects.filter(**mine).order_by("-refused_at", "-pk").first()
        if refused is not None:
            return {"status": "refused", "update_hash": refused.update_hash,
                    "reason": refused.reason}  # fmt: skip
    raise NotFound("This node has no upload for such a task.")
