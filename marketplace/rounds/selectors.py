"""Reads for rounds and tasks: a job's rounds, what each node did for it, and what a node has
done."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet, Sum

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import Round, Task, TaskResult


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
