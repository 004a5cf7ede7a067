"""Where a zones job's task sends its update (rounds.zones, regional aggregation): the claim's
`zone`. Read by the claim in the web process, so it needs no torch (issue 36); accepting the
partial sums is rounds.zones' (the aggregator's upload)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import online_nodes
from marketplace.rounds.models import Task
from marketplace.rounds.sizing import is_far
from trainer.zone_tokens import member_token, round_key

# the start of the last_error of a task released because its aggregator's partial did not
# count (rounds.zones, rounds.zone_checks): it goes flat next time, since the aggregator,
# having passed its update on, answers a retry of the same bytes as delivered
PARTIAL_FAILED = "zone partial "


def uses_zones(task: Task) -> bool:
    return task.round.job.parsed_spec.aggregation.hierarchy == "zones"


def aggregator_for(zone: str) -> Node | None:
    """The zone's aggregator: its online platform node that serves a zone endpoint (the
    lowest id, so every claim in the zone agrees), or None."""
    if not zone:
        return None
    candidates = online_nodes().filter(kind=NodeKind.PLATFORM, zone=zone).exclude(zone_url="")
    return candidates.order_by("pk").first()


def zone_key(round_id: object, aggregator_id: object) -> str:
    """The key the aggregator checks this round's member tokens with."""
    return round_key(settings.SECRET_KEY, round_id, aggregator_id)


def replicated(task: Task) -> bool:
    return Task.objects.filter(round_id=task.round_id, shard_id=task.shard_id).count() > 1


def zone_route(task: Task) -> dict[str, Any] | None:
    """Where a just-leased task's update goes (the claim's `zone`), or None: to the
    coordinator, as on a flat job."""
    if not uses_zones(task):  # the job's spec never changes: no need to read the lease
        return None
    # as leased: a claim's task objects may predate their lease
    task = Task.objects.select_related("node", "shard", "round__job").get(pk=task.pk)
    node = task.node
    if node is None or not node.zone or task.shard is None or not uses_zones(task):
        return None
    if is_far(task.round.plan, node.pk) or replicated(task):
        return None
    if task.last_error.startswith(PARTIAL_FAILED):
        return None
    aggregator = aggregator_for(node.zone)
    if aggregator is None or aggregator.pk == node.pk:
        return None
    samples = task.shard.size
    key = zone_key(task.round_id, aggregator.pk)
    return {
        "name": node.zone,
        "aggregator": aggregator.pk,
        "url": aggregator.zone_url,
        "round_id": task.round_id,
        "samples": samples,
        "token": member_token(key, task.id, node.pk, samples),
    }
