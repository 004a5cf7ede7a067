"""Writes for nodes: registration, heartbeats, offline detection, reliability."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.accounts.services import issue_node_key
from marketplace.events.services import nodes_changed
from marketplace.ledger.holds import forfeit_held
from marketplace.nodes import presence
from marketplace.nodes.bounds import MAX_MEMORY_GB, MAX_MEMORY_MB, finite_in
from marketplace.nodes.enrollment import redeem_enrollment_token
from marketplace.nodes.models import Node, NodeKind, NodeState, NodeTraffic, reliability_score
from marketplace.observability import metrics as obs


def _memory_gb(hardware: dict[str, Any]) -> float:
    """The memory scheduling filters on; a figure out of bounds counts as none (the API's
    schema refuses it first; this guards other callers and the database constraint)."""
    if finite_in(hardware.get("memory_gb"), 0, MAX_MEMORY_GB):
        return float(hardware["memory_gb"])
    if finite_in(hardware.get("memory_mb"), 0, MAX_MEMORY_MB):
        return float(hardware["memory_mb"]) / 1024.0
    return 0.0


@transaction.atomic
def register_node(
    *,
    owner: User,
    name: str,
    kind: str = NodeKind.VOLUNTEER,
    hardware: dict[str, Any],
    benchmark: dict[str, Any],
    network: dict[str, Any],
    price_per_gpu_hour: Decimal,
    availability: dict[str, Any],
    local_datasets: list[dict[str, Any]] | None = None,
    enrollment_token: str | None = None,
    zone: str = "",
    zone_url: str = "",
    runtime: dict[str, Any] | None = None,
) -> tuple[Node, str]:
    """Create a node and its own credential; returns (node, plaintext node key).

    A provider's node is a volunteer. A platform node needs an operator's enrollment token,
    one of whose uses this registration takes (EnrollmentRequired otherwise, and nothing is
    stored). `local_datasets` are {"name", "rows"}: the rows bound its federated updates'
    sample counts.
    """
    token = redeem_enrollment_token(enrollment_token) if kind == NodeKind.PLATFORM else None
    datasets = list(local_datasets or [])
    node = Node.objects.create(
        owner=owner,
        name=name,
        kind=kind,
        hardware=hardware,
        runtime=dict(runtime or {}),
        benchmark=benchmark,
        network=network,
        availability=availability,
        price_per_gpu_hour=price_per_gpu_hour,
        **_dataset_fields(datasets),
        gpu_model=str(hardware.get("gpu_model", ""))[:100],
        memory_gb=_memory_gb(hardware),
        last_heartbeat_at=timezone.now(),
        enrolled_with=token,
        zone=zone,
        zone_url=zone_url if kind == NodeKind.PLATFORM else "",
    )
    _, plaintext = issue_node_key(node)
    nodes_changed()
    return node, plaintext


def _dataset_fields(datasets: list[dict[str, Any]]) -> dict[str, Any]:
    """A node's declared local datasets as its columns: names, rows, and the rest (schema,
    hash) per name; the API's schema (node_data.LocalDatasetSerializer) bounded each."""
    return {
        "local_datasets": [d["name"] for d in datasets],
        "local_dataset_rows": {d["name"]: int(d["rows"]) for d in datasets},
        "local_dataset_schemas": {
            d["name"]: {k: v for k, v in d.items() if k not in ("name", "rows")} for d in datasets
        },
    }


def declare_local_datasets(node: Node, datasets: list[dict[str, Any]]) -> Node:
    """Replace what `node` holds with `datasets` (the agent sends all of them, after any
    change: `gpuflex-node datasets add/remove`). Silos that now fit an open federated round
    join it at the next tick (rounds.maintenance.reserve_new_silos)."""
    fields = _dataset_fields(datasets)
    Node.objects.filter(pk=node.pk).update(**fields)
    for name, value in fields.items():
        setattr(node, name, value)
    return node


def record_heartbeat(
    node_id: int,
    *,
    state: str,
    metrics: dict[str, Any],
    network: dict[str, Any],
    task_id: str | None = None,
    progress: float | None = None,
    reason: str = "",
    task_ids: Sequence[str] = (),
    runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Note a heartbeat and keep the leases of the tasks it names (`task_id` and
    `task_ids`). No database at all with Redis presence (nodes/presence.py: one HSET, the
    tick writes a batch); one UPDATE, and one for leases near expiry, without it."""
    now = timezone.now()
    if runtime is not None:  # rare (the runtime changed): one UPDATE, not on every beat
        Node.objects.filter(pk=node_id).update(runtime=runtime)
    presence.record(
        heartbeat_beat(
            node_id, now, state=state, metrics=metrics, network=network, task_id=task_id,
            progress=progress, reason=reason, task_ids=task_ids,
        )
    )  # fmt: skip
    obs.heartbeat(state)
    return heartbeat_reply(now)


def heartbeat_beat(
    node_id: int,
    at: datetime,
    *,
    state: str,
    metrics: dict[str, Any],
    network: dict[str, Any],
    task_id: str | None = None,
    progress: float | None = None,
    reason: str = "",
    task_ids: Sequence[str] = (),
) -> presence.Beat:
    """What a heartbeat records (record_heartbeat's, and the lean path's in
    api/heartbeat_fast.py): a reason only while paused or waiting, the task and its progress
    among the figures, every task the node holds."""
    reason = reason if state in (NodeState.PAUSED, NodeState.WAITING) else ""
    live = dict(metrics)
    if task_id is not None:
        live["task_id"] = task_id
    if progress is not None:
        live["progress"] = progress
    held = tuple(str(t) for t in (task_id, *task_ids) if t)
    return presence.Beat(node_id, at, state, reason, live, network, held)


def heartbeat_reply(now: datetime) -> dict[str, Any]:
    """What a heartbeat is answered: the server's time and the intervals the node keeps."""
    conf = settings.GPUFLEX
    return {
        "server_time": now,
        "heartbeat_interval_s": conf["HEARTBEAT_INTERVAL_S"],
        "lease_timeout_s": conf["LEASE_TIMEOUT_S"],
    }


def touch(node_id: int) -> None:
    """Any authenticated agent call shows the node is alive (a claim counts as a heartbeat),
    and brings an offline node back to idle."""
    presence.record(presence.Seen(node_id, timezone.now()))


def count_traffic(node_id: int, job_id: object, *, down: int = 0, up: int = 0) -> None:
    """Add payload bytes the server sent to (`down`) or received from (`up`) a node for a job.

    One UPDATE with F() on the hot path; the (node, job) row is created by the first transfer,
    and a request that loses the race to create it adds to the winner's row instead.
    """
    if not (down or up):
        return
    rows = NodeTraffic.objects.filter(node_id=node_id, job_id=job_id)
    bump = {"bytes_down": F("bytes_down") + down, "bytes_up": F("bytes_up") + up}
    if rows.update(**bump):
        return
    try:
        with transaction.atomic():
            NodeTraffic.objects.create(node_id=node_id, job_id=job_id, bytes_down=down, bytes_up=up)
    except IntegrityError:
        rows.update(**bump)


def mark_offline(now: datetime | None = None) -> list[int]:
    """Nodes silent past the timeout go offline; returns their ids (their work is reassigned
    by the caller)."""
    presence.flush()  # heartbeats still in Redis count: `last_heartbeat_at` is read next
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GPUFLEX["NODE_TIMEOUT_S"])
    stale = Node.objects.exclude(state=NodeState.OFFLINE).filter(last_heartbeat_at__lt=cutoff)
    ids = list(stale.values_list("pk", flat=True))
    if ids:
        Node.objects.filter(pk__in=ids).update(state=NodeState.OFFLINE)
        nodes_changed()
    return ids


def record_verification(
    node_id: int,
    *,
    ok: int = 0,
    bad: int = 0,
    lost: int = 0,
    speed_mismatch: int = 0,
    reason: str = "",
    caught: bool = False,
) -> None:
    """Count verified / rejected results, lost leases and tasks that showed an inflated
    benchmark, then recompute reliability.

    A failed result (`bad`, from any check: replicas, segment checks, the statistical
    filter, the privacy check) costs the node its trust: `verified_bad` > 0 makes every later
    task of the node checked (rounds/scheduling.needs_replica, proofs.services.check_share).
    One that re-execution proved wrong (`caught`: a replica majority or a segment check
    disagreed with it) costs it its held earnings too: every running payout hold is forfeited
    to the buyers who paid for that work (ledger/holds.forfeit_held). The statistical filter
    and the privacy check judge an update by its statistics, which an honest node's non-IID
    data can trip: they never take money (issue 35: honest nodes are never flagged)."""
    with transaction.atomic():
        Node.objects.filter(pk=node_id).update(
            verified_ok=F("verified_ok") + ok,
            verified_bad=F("verified_bad") + bad,
            lost_leases=F("lost_leases") + lost,
            speed_mismatches=F("speed_mismatches") + speed_mismatch,
        )
        node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
        node.reliability = reliability_score(
            node.verified_ok, node.verified_bad, node.lost_leases, node.speed_mismatches
        )
        node.save(update_fields=["reliability"])
        if bad and caught:
            forfeit_held(node_id, reason or f"{bad} result(s) failed verification")


def set_price(node: Node, price: Decimal) -> Node:
    """A provider changes the node's asking price. Leases already taken keep the price they
    were taken at (Task.price_per_gpu_hour): a change only affects work leased afterwards."""
    if price < 0:
        raise ValueError("a price cannot be negative")
    node.price_per_gpu_hour = price
    node.save(update_fields=["price_per_gpu_hour"])
    return node
