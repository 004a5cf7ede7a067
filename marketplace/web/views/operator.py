"""Operators: network health, jobs and nodes at a glance, and the ledger's reconciliation."""

from __future__ import annotations

from django.apps import apps
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from marketplace.jobs.selectors import jobs_by_status, jobs_of
from marketplace.ledger.reconcile import reconcile
from marketplace.nodes.selectors import network_of, nodes_by_state, nodes_of, online_nodes
from marketplace.web.access import operator_required
from marketplace.web.heatmap import latency_matrix

HEATMAP_NODES = 40  # beyond this a matrix stops being readable; the node table has the rest


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
        "jobs": jobs_of(request.user).select_related("buyer").order_by("-created_at")[:50],
        "report": reconcile(),
        # the admin is mounted by the project's urls when django.contrib.admin is installed
        "admin_url": "/admin/" if apps.is_installed("django.contrib.admin") else None,
    }
    return render(request, "web/operator.html", context)
