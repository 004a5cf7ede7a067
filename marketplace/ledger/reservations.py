"""Per-lease reservations against a job's escrow (docs/money.md, "Budgets").

Leasing a task reserves the most its charge could ever be (`metering.max_charge` at the
lease's bounded seconds, the node's speed factor and price, the full bonus). A
job's free escrow is its escrow balance less its open reservations, and a lease is only
made when the free escrow covers it, so a charge never finds the escrow short.

Only reservers need a lock: converting, shrinking and releasing a reservation never lower
a job's free escrow (a charge takes at most what its reservation held). Reservers lock the
job with a transaction-scoped PostgreSQL advisory lock, not a row: the escrow account row
is locked by charges inside an aggregation that then cancels tasks a claim may hold, and a
claim holding those tasks must never wait for it. Advisory locks are taken in key order
(a claim that meets a job out of order only tries the lock and skips the job when it is
taken), so reservers never deadlock. SQLite serialises writers and takes no lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import QuerySet
from django.utils import timezone

from marketplace.ledger.metering import Meter, Rules, max_charge, speed_factor
from marketplace.ledger.models import Entry, EscrowFloor, Reservation, ReservationState
from marketplace.ledger.money import ZERO, q
from marketplace.ledger.sums import exact_sums_by
from marketplace.nodes.models import Node
from marketplace.nodes.selectors import speed_of
from marketplace.server.prepared import array_literal, prepared_cursor

# the advisory locks' class id: "GFRV" (GPUFlex reservations)
_LOCK_CLASS = 0x47465256 - 2**31


def _lock_key(job_id: object) -> int:
    """A job's advisory lock id: 32 bits of its UUID (a collision only serialises two jobs)."""
    return (getattr(job_id, "int", None) or hash(job_id)) % 2**32 - 2**31


def lease_bound(node: Node, rules: Rules | None = None) -> Meter:
    """What one lease by `node` reserves: `max_charge` at LEASE_TIMEOUT_S (the most compute
    seconds an upload can bill), the node's speed factor from its one speed figure now
    (nodes.selectors.speed_of; the charge is metered with it as a bound) and its price now
    (the lease's price)."""
    rules = rules or Rules.from_settings()
    return max_charge(
        seconds=float(settings.GPUFLEX["LEASE_TIMEOUT_S"]),
        speed=speed_factor(speed_of(node), rules),
        price_per_hour=Decimal(node.price_per_gpu_hour),
        rules=rules,
    )


def free_escrow(job_ids: Iterable[object]) -> dict[object, Decimal]:
    """job id -> escrow balance less open reservations: two grouped queries for any number
    of jobs."""
    ids = list(job_ids)
    if not ids:
        return {}
    if connection.vendor == "postgresql":
        return _free_escrow_postgres(ids)
    held = exact_sums_by(Entry.objects.filter(account__job_id__in=ids), "account__job_id")
    reserved = exact_sums_by(
        Reservation.objects.filter(job_id__in=ids, state=ReservationState.OPEN), "job_id"
    )
    return {j: q(held.get(j, ZERO) - reserved.get(j, ZERO)) for j in ids}


def _free_escrow_postgres(ids: list[object]) -> dict[object, Decimal]:
    """`free_escrow` as one statement (NUMERIC sums are exact here), through the database's
    own `gpuflex_free_escrow` (migration ledger 0007), which `gpuflex_reserve` reads too."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT j.id, gpuflex_free_escrow(j.id) FROM unnest(%s::uuid[]) AS j(id)", [ids]
        )
        free = {str(j): amount for j, amount in cursor.fetchall()}
    return {j: q(free[str(j)]) for j in ids}


def reserve_all(
    leases: Sequence[tuple[object, object]], node: Node, *, commit: bool = False
) -> bool:
    """Reserve one lease by `node` for each (task id, job id) of a claim, all or none, within
    the caller's transaction: True when every job's free escrow covered its share (the
    reservations are written), False when one did not (nothing written; the caller rolls
    back). The jobs are locked waiting, in key order, as `Funds.load` locks them.

    On PostgreSQL it is one call (`gpuflex_reserve`, migration ledger 0007): the locks, the
    check and the writes, so a claim holds the jobs' locks for that call and its commit
    only, where every other claim on the job waits.

    `commit`: the reservations are the transaction's last statement, so where the caller's
    atomic block is the outermost one (`commits_here`) the call goes out with the
    transaction's `COMMIT` in one pipeline: the jobs' locks are released by the round trip
    that took them, without waiting for this thread to be scheduled again to send the
    `COMMIT` (ledger 0010). True then means committed; on False the transaction is aborted,
    for the caller's block to roll back. Inside an enclosing block, as without."""
    if not leases:
        return True
    if connection.vendor != "postgresql":
        funds = Funds()
        funds.load({job for _, job in leases})
        for task, job in leases:
            if not funds.affords(job, node):
                return False
            funds.reserve(task, job, node)
        funds.save()
        return True
    bound = lease_bound(node)
    keys = sorted({_lock_key(job) for _, job in leases})
    n = len(leases)
    commit = commit and commits_here()
    params = [_LOCK_CLASS, *map(array_literal, (
        keys, [t for t, _ in leases], [j for _, j in leases], [node.pk] * n,
        [bound.gross] * n, [bound.metered_s] * n, [bound.speed] * n)),
        timezone.now(), commit]  # fmt: skip
    statement = (
        "SELECT gpuflex_reserve(%s, %s::int[], %s::uuid[], %s::uuid[], %s::bigint[], "
        "%s::numeric[], %s::float8[], %s::float8[], %s, %s)"
    )
    with prepared_cursor() as cursor:
        if commit:
            return _call_and_commit(cursor, statement, params)
        cursor.execute(statement, params)
        return bool(cursor.fetchone()[0])


# gpuflex_reserve's error when it is told to raise on a short escrow (ledger 0010)
_SHORT = "GF001"


def commits_here() -> bool:
    """Whether the atomic block running now is the outermost one (its end is a COMMIT)."""
    return connection.in_atomic_block and len(connection.atomic_blocks) == 1


def _call_and_commit(cursor: Any, statement: str, params: list[Any]) -> bool:
    """Run `statement` (which raises `_SHORT` rather than return false) and COMMIT in one
    pipeline. PostgreSQL skips the queued COMMIT when the statement fails, and the
    transaction is left aborted. Django's atomic block then finds nothing left to commit
    (psycopg's commit on an idle connection does nothing) and runs its on-commit hooks."""
    raw = connection.connection
    try:
        with connection.wrap_database_errors, raw.pipeline():
            cursor.execute(statement, params)
            raw.commit()  # queued behind the call and sent with it
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == _SHORT:
            return False
        raise
    return True


@dataclass
class Funds:
    """The free escrow of the jobs one claim transaction leases from: each job is locked and
    read once, reservations are counted down as leases are made and written in one INSERT
    (`save`). Use within the claim's transaction."""

    rules: Rules = field(default_factory=Rules.from_settings)
    free: dict[object, Decimal] = field(default_factory=dict)
    held_keys: list[int] = field(default_factory=list)
    # (task id, job id, node id, amount, seconds, speed): tuples, not model instances, since
    # the bulk path makes thousands
    made: list[tuple[Any, ...]] = field(default_factory=list)
    _bounds: dict[int, Meter] = field(default_factory=dict)

    def bound(self, node: Node) -> Meter:
        if node.pk not in self._bounds:
            self._bounds[node.pk] = lease_bound(node, self.rules)
        return self._bounds[node.pk]

    def load(self, job_ids: Iterable[object]) -> None:
        """Lock (in key order, waiting) and read jobs not seen yet: the bulk path's way."""
        new = sorted({j for j in job_ids if j not in self.free}, key=_lock_key)
        keys = sorted({_lock_key(j) for j in new} - set(self.held_keys))
        if keys and connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # one statement takes them all, in key order
                cursor.execute(
                    "SELECT count(pg_advisory_xact_lock(%s, k)) "
                    "FROM (SELECT unnest(%s::int[]) AS k ORDER BY 1) AS keys",
                    [_LOCK_CLASS, keys],
                )
        self.held_keys.extend(keys)
        self.free |= free_escrow(new)

    def affords(self, job_id: object, node: Node) -> bool:
        """Whether the job can reserve one lease by `node`; a job first met out of lock order
        whose lock another claim holds is skipped for this claim (False)."""
        if job_id not in self.free:
            if not self._lock(
                job_id, wait=not self.held_keys or _lock_key(job_id) > max(self.held_keys)
            ):
                return False
            self.free |= free_escrow([job_id])
        return self.free[job_id] >= self.bound(node).gross

    def reserve(self, task_id: object, job_id: object, node: Node) -> None:
        """Count down a lease just won (call only after `affords` said yes)."""
        bound = self.bound(node)
        self.free[job_id] -= bound.gross
        self.made.append((task_id, job_id, node.pk, bound.gross, bound.metered_s, bound.speed))

    def save(self) -> None:
        """Write the reservations made: one statement for the whole claim. A task
        being leased holds no lease, so an open reservation it still has is stale (a lease
        put back by code that did not release it): it is released, never doubled."""
        if self.made:
            _insert(self.made)
            self.made = []

    def _lock(self, job_id: object, *, wait: bool) -> bool:
        key = _lock_key(job_id)
        if connection.vendor != "postgresql" or key in self.held_keys:
            self.held_keys.append(key)
            return True
        with connection.cursor() as cursor:
            if wait:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, key])
            else:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, key])
                if not cursor.fetchone()[0]:
                    return False
        self.held_keys.append(key)
        return True


def _insert(rows: list[tuple[Any, ...]]) -> None:
    """Raw SQL, as the bulk lease's own UPDATE: Django's bulk_create spends seconds of Python
    on ten thousand model instances."""
    table = Reservation._meta.db_table
    now = timezone.now()
    ids = [r[0] for r in rows]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # one statement, one round trip under the job's escrow lock: the stale open
            # reservations are released first (the INSERT's rows wait on the count of
            # `released`, which runs the UPDATE to its end), so the new ones never meet
            # them in reservation_one_open
            task, job, node, amount, seconds, speed = (list(c) for c in zip(*rows, strict=True))
            # reserved here, not by gpuflex_reserve: its jobs' floors (EscrowFloor) no longer
            # hold; under the same locks, so no claim reads them in between
            cursor.execute(
                f"DELETE FROM {EscrowFloor._meta.db_table} WHERE job_id = ANY(%s::uuid[])",
                [sorted({str(j) for j in job})],
            )
            cursor.execute(
                f"""
                WITH released AS (
                    UPDATE {table} SET state = %s, closed_at = %s
                    WHERE state = %s AND task_id = ANY(%s::uuid[]) RETURNING 1
                )
                INSERT INTO {table} (task_id, job_id, node_id, amount, seconds, speed, state,
                                     created_at)
                SELECT v.task, v.job, v.node, v.amount, v.seconds, v.speed, %s, %s
                FROM unnest(%s::uuid[], %s::uuid[], %s::bigint[], %s::numeric[],
                            %s::float8[], %s::float8[])
                    AS v(task, job, node, amount, seconds, speed)
                WHERE (SELECT count(*) FROM released) >= 0
                """,
                [ReservationState.RELEASED, now, ReservationState.OPEN, ids,
                 ReservationState.OPEN, now, task, job, node, amount, seconds, speed],
            )  # fmt: skip
            return
    Reservation.objects.filter(task_id__in=ids, state=ReservationState.OPEN).update(
        state=ReservationState.RELEASED, closed_at=now
    )
    field = Reservation._meta.get_field

    def prep(name: str, value: object) -> object:
        return field(name).get_db_prep_save(value, connection)

    params = [
        (prep("task", t), prep("job", j), n, prep("amount", a), sec, sp,
         ReservationState.OPEN, prep("created_at", now))
        for t, j, n, a, sec, sp in rows
    ]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (task_id, job_id, node_id, amount, seconds, speed, state, "
            "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            params,
        )


def open_reservation(task_id: object) -> Reservation | None:
    return Reservation.objects.filter(task_id=task_id, state=ReservationState.OPEN).first()


def shrink_on_upload(task_id: object, compute_s: float) -> None:
    """An upload bills at most `compute_s` seconds: the reservation shrinks to that bound,
    freeing the rest of the lease's reservation for other leases."""
    res = open_reservation(task_id)
    if res is None:
        return
    seconds = min(max(compute_s, 0.0), res.seconds)
    rules = Rules.from_settings()
    price = res.task.price_per_gpu_hour
    if price is None:
        return
    amount = max_charge(seconds=seconds, speed=res.speed, price_per_hour=Decimal(price),
                        rules=rules).gross  # fmt: skip
    if amount < res.amount:
        Reservation.objects.filter(pk=res.pk, state=ReservationState.OPEN).update(
            amount=amount, seconds=seconds
        )


def close(reservation: Reservation, state: str) -> None:
    Reservation.objects.filter(pk=reservation.pk, state=ReservationState.OPEN).update(
        state=state, closed_at=timezone.now()
    )


def release_tasks(task_ids: Iterable[object]) -> int:
    """Leases lost, failed or rejected: nothing will be charged for them."""
    ids = list(task_ids)
    if not ids:
        return 0
    return Reservation.objects.filter(task_id__in=ids, state=ReservationState.OPEN).update(
        state=ReservationState.RELEASED, closed_at=timezone.now()
    )


def release_job(job_id: object) -> int:
    """A job that ended charges nothing more: every open reservation goes."""
    return Reservation.objects.filter(job_id=job_id, state=ReservationState.OPEN).update(
        state=ReservationState.RELEASED, closed_at=timezone.now()
    )


def cheapest_lease(nodes: QuerySet[Node]) -> Decimal | None:
    """The least a lease reserves over `nodes` (the online nodes that may work on a job:
    rounds.scheduling.online_candidates); None when there are none (then nobody can tell
    what it would cost)."""
    rules = Rules.from_settings()
    fields = ("price_per_gpu_hour", "benchmark", "speed_tflops")
    bounds = [lease_bound(n, rules).gross for n in nodes.only(*fields)]
    return min(bounds) if bounds else None


def unaffordable(job_id: object, candidates: Callable[[], QuerySet[Node]]) -> str:
    """Why the job can pay for no further task, or "": nothing of it is in flight (an open
    reservation may still free escrow when its result is settled) and its free escrow is
    less than the cheapest lease any online node that may work on it would reserve.
    `candidates()` gives those nodes; it is only asked when nothing is in flight (reading
    every node is most of this check's cost, and a running job almost always has work out)."""
    if Reservation.objects.filter(job_id=job_id, state=ReservationState.OPEN).exists():
        return ""
    need = cheapest_lease(candidates())
    free = free_escrow([job_id])[job_id]
    if need is None or free >= need:
        return ""
    lease_s = settings.GPUFLEX["LEASE_TIMEOUT_S"]
    return (
        f"the budget has {free} left and one more task would reserve at least {need} (a lease "
        f"of up to {lease_s:g} s on the cheapest node online that may work on it, at its price "
        "and speed, with the full quality bonus)"
    )
