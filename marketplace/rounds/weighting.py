"""How a round's updates are weighted when it is aggregated (spec `aggregation.weighting`).

"samples" leaves them as they are. "health" weighs each by num_samples x its node's health
score (trainer.aggregation.weighting): the score the round's plan gave the node when the job
is adaptive, and otherwise (or for a node the plan did not cover, such as one folded in late)
the score the policy would give it now, from the same record the planner reads.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import Round
from marketplace.rounds.sizing import measurement, plan_key
from trainer.adapt.health import health

if TYPE_CHECKING:
    from trainer.aggregation import ClientUpdate

Labelled = tuple["ClientUpdate", str]


def health_scores(job: Job, rnd: Round, node_ids: Iterable[object]) -> dict[str, float]:
    """node id (as a string, the updates' node_id) -> health score in [0, 1]."""
    wanted = set(node_ids)
    plan = rnd.plan or {}
    scores: dict[str, float] = {}
    for nid in wanted:
        entry = plan.get(plan_key(nid))
        if isinstance(entry, dict) and entry.get("health") is not None:
            scores[str(nid)] = float(entry["health"])
    if len(scores) == len(wanted):
        return scores
    spec = job.parsed_spec
    measured = {str(n.pk): measurement(n, spec) for n in Node.objects.filter(pk__in=wanted)}
    if not measured:
        return scores  # nodes since deleted: unscored, so counted as healthy
    # as plan_round does: the median contributor's step time scores 1 on compute
    ref_step = statistics.median(m.step_s for m in measured.values())
    for nid in measured.keys() - scores.keys():
        scores[nid] = health(measured[nid], ref_step).score
    return scores


def weigh(job: Job, rnd: Round, updates: list[Labelled]) -> tuple[list[Labelled], dict[str, Any]]:
    """The updates as the job's spec weights them, and what to add to the round's metrics:
    the weighting used and, for "health", each contributing node's score."""
    from trainer.aggregation import health_weighted

    if job.parsed_spec.aggregation.weighting != "health":
        return updates, {"weighting": "samples"}
    scores = health_scores(job, rnd, {u.node_id for u, _ in updates})
    weighted, used = health_weighted(updates, scores)
    return weighted, {"weighting": used, "health": {k: round(v, 4) for k, v in scores.items()}}
