"""Operators: network health, jobs and nodes at a glance, and the ledger's reconciliation."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from marketplace.events import topics
from marketplace.events.stream import event_stream
from marketplace.jobs.selectors import jobs_by_status, jobs_of
from marketplace.ledger.reconcile import reconcile
from marketplace.nodes.selectors import network_of, nodes_by_state, nodes_of, online_nodes
from marketplace.web.access import operator_required
from marketplace.web.heatmap import latency_matrix

HEATMAP_NODES = 40  # beyond this a matrix stops being readable; the node table has the rest
RECENT_JOBS = 50
# the overview reconciles the whole ledger: rebuilt at most this often however busy the network
LIVE_INTERVAL_S = 1.0


def _rtt(node) -> float | None:
    value = network_of(node).get("rtt_ms")
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


@operator_required
def overview(request: HttpRequest) -> HttpResponse:
    online = list(online_nodes().order_by("pk")[:HEATMAP_NODES])
    matrix = latency_matrix([_rtt(n) for n in online])
    context = {
        "jobs_by_status": jobs_by_status(),
        "nodes_by_state": nodes_by_state(),
        "heatmap": list(zip(online, matrix, strict=True)),
        "heat_nodes": online,
        "nodes": [(n, network_of(n)) for n in nodes_of(request.user)[:200]],
        "jobs": _recent_jobs(request.user),
        "report": reconcile(),
        # the admin is mounted by the project's urls when django.contrib.admin is installed
        "admin_url": "/admin/" if apps.is_installed("django.contrib.admin") else None,
    }
    return render(request, "web/operator.html", context)


def _recent_jobs(user: Any) -> Any:
    return jobs_of(user).select_related("buyer").order_by("-created_at")[:RECENT_JOBS]


def _live(user: Any) -> dict[str, Any]:
    """The overview's figures that change while it is open: its cards and the jobs table."""
    report = reconcile()
    return {
        "nodes_online": online_nodes().count(),
        "nodes_by_state": nodes_by_state(),
        "nodes_registered": nodes_of(user).count(),
        "jobs_by_status": jobs_by_status(),
        "ledger": {"ok": report.ok, "problems": report.problems, "checks": len(report.checked)},
        "jobs": [
            {
                "url": reverse("web:job", args=[job.pk]),
                "name": job.name,
                "buyer": str(job.buyer),
                "status": job.status,
                "rounds_done": job.rounds_done,
            }
            for job in _recent_jobs(user)
        ],
    }


@operator_required
@require_GET
def overview_live(request: HttpRequest) -> JsonResponse:
    return JsonResponse(_live(request.user))


@operator_required
@require_GET
def overview_events(request: HttpRequest) -> HttpResponse:
    """The overview's figures, pushed as jobs, nodes and money change (at most once a
    second: each render reconciles the ledger)."""
    user = request.user
    return event_stream([topics.OPERATOR], lambda: _live(user), min_interval=LIVE_INTERVAL_S)
