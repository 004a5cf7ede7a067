"""Reads for nodes."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min, QuerySet, Sum
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.nodes.bounds import NETWORK_BOUNDS, clean_benchmark, clean_figures
from marketplace.nodes.models import Node, NodeState, NodeTraffic


def nodes_of(user: User) -> QuerySet[Node]:
    # its speed figure and flag are columns of the row (speed_summary): nothing to join
    if user.is_operator:
        return Node.objects.order_by("pk")
    return Node.objects.filter(owner=user).order_by("pk")


def nodes_owned_by(user: User) -> QuerySet[Node]:
    """The user's own nodes, operators' included: what a person's earnings come from."""
    return Node.objects.filter(owner=user).order_by("pk")


def job_traffic(job_id: object) -> dict[int, dict[str, Any]]:
    """Payload bytes the server moved for each node on a job, from its own counters
    (NodeTraffic): node id -> {"name", "bytes_up", "bytes_down"}; nodes that moved nothing
    for the job are absent."""
    rows = (
        NodeTraffic.objects.filter(job_id=job_id)
        .order_by("node_id")
        .values_list("node_id", "node__name", "bytes_up", "bytes_down")
    )
    return {nid: {"name": name, "bytes_up": up, "bytes_down": down} for nid, name, up, down in rows}


def online_nodes() -> QuerySet[Node]:
    cutoff = timezone.now() - timedelta(seconds=settings.GPUFLEX["NODE_TIMEOUT_S"])
    return Node.objects.exclude(state=NodeState.OFFLINE).filter(last_heartbeat_at__gte=cutoff)


def _money(value: object) -> str:
    # SQLite hands back aggregates of decimals as floats; always show the field's 4 places
    return str(Decimal(str(value)).quantize(Decimal("0.0001")))


def device_label(node_or_model: Node | str) -> str:
    """What a node computes on, as the market names it: its GPU's model, or "CPU" for a node
    without one (a CPU node registers no GPU model)."""
    model = node_or_model if isinstance(node_or_model, str) else node_or_model.gpu_model
    return model or "CPU"


def market_capacity() -> dict[str, Any]:
    """Online nodes by device (GPU model, or CPU) and kind, with their price range and the
    range of their measured fp32 TFLOP/s: what a buyer can expect to get."""
    rows = (
        online_nodes()
        .values("gpu_model", "kind")
        .annotate(
            nodes=Count("pk"),
            memory_gb=Sum("memory_gb"),
            min_price=Min("price_per_gpu_hour"),
            max_price=Max("price_per_gpu_hour"),
        )
        .order_by("gpu_model", "kind")
    )
    # each node's one speed figure (speed_of: what its tasks show, its benchmark as the
    # prior; benchmarks are JSON, validated as read): ranged here, not in SQL
    tflops: dict[tuple[str, str], list[float]] = {}
    for node in online_nodes().only("gpu_model", "kind", "benchmark", "speed_tflops"):
        fp32 = speed_of(node)
        if fp32 is not None:
            tflops.setdefault((node.gpu_model, node.kind), []).append(float(fp32))
    models = []
    for r in rows:
        measured = tflops.get((r["gpu_model"], r["kind"]), [])
        models.append(
            {
                "gpu_model": device_label(r["gpu_model"]),
                "kind": r["kind"],
                "nodes": r["nodes"],
                "memory_gb": round(r["memory_gb"] or 0.0, 2),
                "min_price_per_gpu_hour": _money(r["min_price"]),
                "max_price_per_gpu_hour": _money(r["max_price"]),
                "min_fp32_tflops": min(measured, default=None),
                "max_fp32_tflops": max(measured, default=None),
            }
        )
    return {"online_nodes": sum(m["nodes"] for m in models), "gpus": models}


def nodes_by_state() -> dict[str, int]:
    """How many nodes are in each state, for the operator's overview."""
    rows = Node.objects.order_by().values("state").annotate(n=Count("pk"))
    return {r["state"]: r["n"] for r in rows}


def network_of(node: Node) -> dict[str, float]:
    """The node's link as last measured (heartbeats), over what it registered with: only
    figures that are numbers within bounds (a value stored before validation, or by hand,
    counts as unreported), so one node's data never breaks another's claim or page."""
    registered = clean_figures(node.network, NETWORK_BOUNDS)
    return registered | clean_figures(node.live_network, NETWORK_BOUNDS)


def benchmark_of(node: Node) -> dict[str, Any]:
    """The node's benchmark figures the marketplace computes with, validated as it reads
    them (as network_of): billing and sizing never meet a string or an infinity."""
    return clean_benchmark(node.benchmark)


def speed_of(node: Node) -> float | None:
    """THE node's speed, fp32 TFLOP/s (ledger/speed.py): what its tasks show blended with its
    benchmark, or its benchmark before any task was observed; None without either. Sharding,
    sizing, scheduling's requirement, the lease's reservation and billing all read this, and
    it reads only the row (no query), so the claim path may call it."""
    return speed_figure(node.speed_tflops, node.benchmark)


def speed_figure(stored: float | None, benchmark: object) -> float | None:
    """speed_of from a row's columns (for queries that read values, not instances)."""
    if stored is not None and stored > 0:
        return float(stored)
    return clean_benchmark(benchmark).get("fp32_tflops")


def speed_summary(node: Node) -> dict[str, Any]:
    """The node's speed as its provider and operators see it (API detail, nodes page)."""
    return {
        "advertised_tflops": benchmark_of(node).get("fp32_tflops"),
        "speed_tflops": speed_of(node),
        "observed_tflops": node.speed_observed_tflops,
        "tasks": node.speed_tasks,
        "flagged": bool(node.speed_flag),
        "note": node.speed_flag,
    }


def on_probation(node: Node) -> bool:
    """The one rule for a volunteer whose every task is checked: too few results verified yet
    (TRUST_AFTER_VERIFIED), or one ever failed a check. Replication (rounds/scheduling) and
    segment checks (proofs/services) both ask it."""
    return node.verified_ok < settings.GPUFLEX["TRUST_AFTER_VERIFIED"] or node.verified_bad > 0
