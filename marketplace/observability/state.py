"""Gauges read from the database (and the broker) when /metrics is scraped: what is true now,
whichever process changed it, with no bookkeeping on the hot paths. A handful of indexed
aggregate queries per scrape (every 15 s or so), none per request."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from marketplace.observability import broker

log = logging.getLogger(__name__)


def _nodes() -> Iterator[Metric]:
    from marketplace.nodes.models import Node, NodeState

    counts = dict.fromkeys(NodeState.values, 0)
    for row in Node.objects.order_by().values("state").annotate(n=Count("pk")):
        counts[row["state"]] = row["n"]
    g = GaugeMetricFamily(
        "gpuflex_nodes", "Registered nodes by state (offline included).", labels=["state"]
    )
    for state, n in sorted(counts.items()):
        g.add_metric([state], n)
    yield g


def _tasks() -> Iterator[Metric]:
    from marketplace.rounds.models import Round, RoundStatus, Task, TaskStatus

    waiting = {TaskStatus.PENDING: 0, TaskStatus.LEASED: 0}
    rows = Task.objects.filter(status__in=list(waiting)).order_by().values("status")
    for row in rows.annotate(n=Count("pk")):
        waiting[row["status"]] = row["n"]
    yield GaugeMetricFamily(
        "gpuflex_task_queue_depth",
        "Tasks waiting for a node (pending) in any round.",
        value=waiting[TaskStatus.PENDING],
    )
    yield GaugeMetricFamily(
        "gpuflex_tasks_leased", "Tasks leased to a node now.", value=waiting[TaskStatus.LEASED]
    )
    live = {RoundStatus.OPEN: 0, RoundStatus.AGGREGATING: 0}
    rows = Round.objects.filter(status__in=list(live)).order_by().values("status")
    for row in rows.annotate(n=Count("pk")):
        live[row["status"]] = row["n"]
    g = GaugeMetricFamily(
        "gpuflex_rounds_in_flight", "Rounds open or aggregating now.", labels=["status"]
    )
    for status, n in live.items():
        g.add_metric([str(status)], n)
    yield g


def _jobs() -> Iterator[Metric]:
    from marketplace.jobs.models import Job, JobStatus

    counts = {JobStatus.RUNNING: 0, JobStatus.PAUSED: 0}
    rows = Job.objects.filter(status__in=list(counts)).order_by().values("status")
    for row in rows.annotate(n=Count("pk")):
        counts[row["status"]] = row["n"]
    g = GaugeMetricFamily("gpuflex_jobs_active", "Jobs running or paused.", labels=["status"])
    for status, n in counts.items():
        g.add_metric([str(status)], n)
    yield g


def _money() -> Iterator[Metric]:
    from marketplace.ledger.models import (
        AccountKind,
        Entry,
        Payout,
        PayoutStatus,
        Transaction,
        TxKind,
    )
    from marketplace.ledger.sums import exact_sum

    held = exact_sum(Entry.objects.filter(account__kind=AccountKind.JOB_ESCROW))
    yield GaugeMetricFamily(
        "gpuflex_escrow_held_credits",
        "Credits held in job escrow accounts (budgets not yet charged or released).",
        value=float(held),
    )
    now = timezone.now()
    lag = GaugeMetricFamily(
        "gpuflex_settlement_lag_seconds",
        "Age of the oldest item waiting to be settled, 0 when none waits: `payouts` "
        "(requested, not yet batched or paid) and, with a chain, `contributions` (verified "
        "work charged but in no settlement batch yet).",
        labels=["what"],
    )
    oldest_payout = Payout.objects.filter(status=PayoutStatus.REQUESTED).aggregate(
        t=Min("created_at")
    )["t"]
    lag.add_metric(["payouts"], (now - oldest_payout).total_seconds() if oldest_payout else 0.0)
    if settings.CHAIN.get("URL"):
        oldest_charge = Transaction.objects.filter(
            kind=TxKind.CHARGE, settlement__isnull=True, node__isnull=False
        ).aggregate(t=Min("created_at"))["t"]
        lag.add_metric(
            ["contributions"], (now - oldest_charge).total_seconds() if oldest_charge else 0.0
        )
    yield lag


def _broker_queues() -> Iterator[Metric]:
    lengths = broker.queue_lengths()
    if not lengths:
        return
    g = GaugeMetricFamily(
        "gpuflex_celery_queue_length",
        "Celery messages waiting in the broker, by queue (aggregations, ticks, exports).",
        labels=["queue"],
    )
    for queue, n in lengths.items():
        g.add_metric([queue], n)
    yield g


_PARTS: dict[str, Callable[[], Iterator[Metric]]] = {
    "nodes": _nodes,
    "tasks": _tasks,
    "jobs": _jobs,
    "money": _money,
    "broker": _broker_queues,
}


class StateCollector(Collector):
    """Each part on its own: a broker that is down still leaves the database's figures, and
    `gpuflex_state_scrape_errors{part}` says which part could not be read."""

    def collect(self) -> Iterator[Metric]:
        errors = GaugeMetricFamily(
            "gpuflex_state_scrape_errors",
            "1 when this part of the state gauges could not be read at this scrape.",
            labels=["part"],
        )
        for name, part in _PARTS.items():
            try:
                metrics = list(part())
            except Exception:
                log.warning("metrics: cannot read %s", name, exc_info=True)
                errors.add_metric([name], 1)
                continue
            errors.add_metric([name], 0)
            yield from metrics
        yield errors
