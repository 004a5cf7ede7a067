"""Reads for jobs: what a buyer may see of them (their rounds and tasks: rounds.selectors)."""

from __future__ import annotations

from django.db.models import Count, Prefetch, QuerySet

from marketplace.accounts.models import User
from marketplace.jobs.market import why_no_node
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node, NodeState
from marketplace.nodes.selectors import online_nodes
from marketplace.rounds.lifecycle import silo_fits
from marketplace.rounds.models import Round
from marketplace.rounds.scheduling import nodes_that_may_work_on


def jobs_of(user: User) -> QuerySet[Job]:
    """A buyer's own jobs (operators see all); anything else is a 404 to them."""
    qs = Job.objects.all() if user.is_operator else Job.objects.filter(buyer=user)
    return qs.prefetch_related(Prefetch("rounds", queryset=Round.objects.order_by("number")))


def jobs_by_status() -> dict[str, int]:
    """How many jobs are in each status, for the market page and the operator's overview."""
    rows = Job.objects.order_by().values("status").annotate(n=Count("pk"))
    return {r["status"]: r["n"] for r in rows}


# how a federated job's updates are checked, where no replica can redo a silo's task
FEDERATED_VERIFICATION = (
    "No replicas: a silo's data is its own, so no other node can redo its task. Its updates "
    "are checked statistically instead: each within the spec's update-norm bound "
    "(aggregation.max_update_norm), weighted by a sample count no larger than the rows its "
    "node declared, and dropped (unpaid) when it points away from the others (the cosine "
    "screen at aggregation)."
)


def federated_status(job: Job) -> dict | None:
    """A federated job's silos: how many online nodes hold its dataset (with rows its model
    takes), how many declare it at all, and how its updates are verified; None otherwise."""
    if not job.is_federated:
        return None
    name = job.federated_dataset
    online = sum(1 for n in online_nodes() if silo_fits(job, n))
    held = Node.objects.exclude(local_datasets=[]).values_list("local_datasets", flat=True)
    declared = sum(1 for names in held if name in (names or []))
    if online:
        summary = f"{online} online node(s) hold the local dataset {name!r} and train on it"
    else:
        summary = (
            f"waiting: no online node holds the local dataset {name!r} ({declared} node(s) "
            "declare it; the job goes on when one comes online)"
        )
    return {"dataset": name, "silos_online": online, "silos_declared": declared,
            "summary": summary, "verification": FEDERATED_VERIFICATION}  # fmt: skip


_STATE_ORDER = (NodeState.WORKING, NodeState.IDLE, NodeState.WAITING, NodeState.PAUSED)


def job_node_states(job: Job) -> dict:
    """The online nodes that may work on this job, by state, with the reasons of those that
    wait or are paused: what a buyer needs when the job does not move ("3 nodes waiting:
    another program uses the GPU (game.exe)")."""
    rows = (
        online_nodes()
        .filter(pk__in=nodes_that_may_work_on(job).values("pk"))
        .values("state", "state_reason")
        .annotate(n=Count("pk"))
        .order_by("state", "state_reason")
    )
    counts = {str(state): 0 for state in _STATE_ORDER}
    reasons: list[dict] = []
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + r["n"]
        if r["state"] in (NodeState.WAITING, NodeState.PAUSED):
            reason = r["state_reason"] or ("paused by its owner" if r["state"] == "paused" else "")
            reasons.append({"state": r["state"], "reason": reason, "nodes": r["n"]})
    reasons.sort(key=lambda x: (-x["nodes"], x["state"], x["reason"]))
    total = sum(counts.values())
    # no node: why, in figures (the price cap against the cheapest node that fits, or the
    # requirement no node meets), the one sentence every surface shows
    summary = why_no_node(job) if total == 0 else _node_summary(counts, reasons)
    return {"nodes": total, "counts": counts, "reasons": reasons, "summary": summary}


def _node_summary(counts: dict[str, int], reasons: list[dict]) -> str:
    parts = [f"{n} {state}" for state, n in counts.items() if n and state in ("working", "idle")]
    for r in reasons:
        noun = "node" if r["nodes"] == 1 else "nodes"
        parts.append(
            f"{r['nodes']} {noun} {r['state']}" + (f": {r['reason']}" if r["reason"] else "")
        )
    return "; ".join(parts)


def scoring_result(job: Job) -> dict | None:
    """A finished evaluate job's score (accuracy, correct, total, loss, loss_sum) or inference
    job's rows and predictions URL; None for training jobs and unfinished scoring jobs."""
    if job.kind == "train":
        return None
    done = [r for r in job.rounds.all() if r.status == "done"]
    if not done:
        return None
    metrics = done[-1].metrics
    if job.kind == "evaluate":
        keys = ("accuracy", "correct", "total", "loss", "loss_sum")
        return {k: metrics.get(k) for k in keys}
    from django.urls import reverse

    return {"rows": metrics.get("rows"), "predictions": reverse("job-predictions", args=[job.pk])}


def ended_job_node_states(job: Job) -> dict:
    """`job_node_states` for a job that has ended: no node works on it any more, whatever the
    nodes do now elsewhere, so it counts the nodes that did (an accepted or a pending result)
    rather than the market's nodes, whose states would go stale on the job's last page."""
    worked = Node.objects.filter(results__task__round__job=job).distinct().count()
    counts = {str(state): 0 for state in _STATE_ORDER}
    noun = "node" if worked == 1 else "nodes"
    summary = (
        f"{job.status}: {worked} {noun} worked on this job; none works on it now"
        if worked
        # and why none did, which is what a buyer who gave up waiting wants to read
        else f"{job.status} before any node worked on it: {job.error or why_no_node(job)}"
    )
    return {"nodes": worked, "counts": counts, "reasons": [], "summary": summary, "ended": True}


def node_states_of(job: Job) -> dict:
    """What the job page and the API show of the nodes for a job: the market's nodes that may
    take it while it runs or is paused, the ones that worked on it once it has ended."""
    return job_node_states(job) if job.is_active else ended_job_node_states(job)
