"""The event metrics: counters and histograms moved where the event happens (services, the
request middleware), one cheap call each, never a database query.

Every series is prefixed `gpuflex_`. Under `gpuflex serve`/`worker`/`beat` the launcher sets
PROMETHEUS_MULTIPROC_DIR (multiproc.py), and prometheus_client then keeps each process's
values in a file there that /metrics merges: the web server's workers and Celery's pool children
add up. State-like figures (queue depth, escrow, nodes by state) are not kept here but read
from the database at scrape time (state.py), which is right whichever process changed them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import transaction
from django.utils import timezone
from prometheus_client import Counter, Histogram

# round and aggregation times run from seconds (the demo's tiny models) to hours
_LONG_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

HTTP_REQUESTS = Counter(
    "gpuflex_http_requests",
    "HTTP requests answered, by URL pattern (not raw path), method and status code.",
    ["route", "method", "status"],
)
HTTP_DURATION = Histogram(
    "gpuflex_http_request_duration_seconds",
    "Wall time from the request middleware in to the response out, by URL pattern.",
    ["route"],
    buckets=_REQUEST_BUCKETS,
)
HEARTBEATS = Counter(
    "gpuflex_heartbeats", "Agent heartbeats received, by the state they reported.", ["state"]
)
CLAIMS = Counter(
    "gpuflex_claims",
    "Agent claims answered: `leased` when at least one task was leased, `again` when a "
    "re-sent claim (its Idempotency-Key seen before) got its lost answer again, else `empty`.",
    ["outcome"],
)
LEASES = Counter("gpuflex_leases", "Tasks leased to nodes (a claim may lease several).")
LEASES_RELEASED = Counter(
    "gpuflex_leases_released",
    "Leases given back before a result: `lost` (node silent or lease expired) or `failed` "
    "(the node reported a failure).",
    ["reason"],
)
ROUNDS_OPENED = Counter("gpuflex_rounds_opened", "Training rounds opened.")
ROUNDS_CLOSED = Counter(
    "gpuflex_rounds_closed",
    "Rounds that stopped taking work (quorum or deadline) and went to aggregation.",
)
ROUNDS_FINISHED = Counter(
    "gpuflex_rounds_finished",
    "Rounds ended: `done` (aggregated or scored) or `cancelled`.",
    ["outcome"],
)
ROUND_DURATION = Histogram(
    "gpuflex_round_duration_seconds",
    "From a round's opening to its end (aggregation included), by outcome.",
    ["outcome"],
    buckets=_LONG_BUCKETS,
)
AGGREGATION_SECONDS = Histogram(
    "gpuflex_aggregation_seconds",
    "Time to aggregate a round's updates into the next model (the worker's compute).",
    buckets=_LONG_BUCKETS,
)
SETTLEMENT_BATCHES = Counter(
    "gpuflex_settlement_batches",
    "On-chain settlement batches closed, by why they closed (count, deadline, manual).",
    ["reason"],
)


def _after_commit(fn: Callable[[], None]) -> None:
    """Count what the database keeps: inside a transaction only once it commits (a rolled
    back round was never opened), straight away outside one."""
    transaction.on_commit(fn)


def heartbeat(state: str) -> None:
    HEARTBEATS.labels(state).inc()


def claimed(leased: int, again: bool = False) -> None:
    """A claim request answered (a long poll counts once, however often it looked); `again`:
    with the tasks an earlier try of it leased."""
    CLAIMS.labels("again" if again else "leased" if leased else "empty").inc()


def lease_released(reason: str) -> None:
    _after_commit(lambda: LEASES_RELEASED.labels(reason).inc())


def round_opened() -> None:
    _after_commit(ROUNDS_OPENED.inc)


def round_closed() -> None:
    _after_commit(ROUNDS_CLOSED.inc)


def round_finished(outcome: str, opened_at: datetime | None) -> None:
    took = (timezone.now() - opened_at).total_seconds() if opened_at else None

    def count() -> None:
        ROUNDS_FINISHED.labels(outcome).inc()
        if took is not None:
            ROUND_DURATION.labels(outcome).observe(max(took, 0.0))

    _after_commit(count)


def rounds_cancelled(opened: list[datetime]) -> None:
    """Several rounds cancelled at once (a job failed or was cancelled)."""
    for opened_at in opened:
        round_finished("cancelled", opened_at)


def aggregation_took(seconds: float) -> None:
    _after_commit(lambda: AGGREGATION_SECONDS.observe(max(seconds, 0.0)))


def settlement_batch(reason: str) -> None:
    _after_commit(lambda: SETTLEMENT_BATCHES.labels(reason or "unknown").inc())


def leased(count: int) -> None:
    """Leases made in the current transaction (claims and bulk scheduling)."""
    if count:
        _after_commit(lambda: LEASES.inc(count))
