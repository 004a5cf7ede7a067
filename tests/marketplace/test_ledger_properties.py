"""Random sequences of grants, jobs, leases with their reservations, uploads, charges,
rejections, lost leases, cancellations, payouts, and payout holds released by verification or
forfeited by a failed one: after every step the ledger reconciles,
every balance matches a simple model of the rules, no job's open reservations exceed its
escrow, and no reserved lease's charge is ever cut."""

from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings as dj_settings
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from marketplace.accounts.services import create_user
from marketplace.jobs.models import Job, JobStatus
from marketplace.ledger import accounts, holds
from marketplace.ledger.errors import InsufficientCredit, InvalidPayout, LedgerError
from marketplace.ledger.metering import Rules, cap, max_charge, meter
from marketplace.ledger.models import Payout, PayoutStatus, Reservation, ReservationState
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.reservations import (
    Funds,
    free_escrow,
    lease_bound,
    release_tasks,
    shrink_on_upload,
)
from marketplace.ledger.services import (
    charge_result,
    grant_credit,
    hold_budget,
    mark_payout_paid,
    release_escrow,
    release_unpaid,
    request_payout,
    reverse_payout,
)
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.rounds.models import Round, Task, TaskResult

pytestmark = pytest.mark.django_db
_ids = itertools.count()
WALLET = "0x" + "cd" * 20
money = st.decimals(min_value="0.01", max_value="50", places=2)


class LedgerMachine(RuleBasedStateMachine):
    @initialize()
    def actors(self) -> None:
        n = next(_ids)
        self.buyers = [create_user(f"hb{n}_{i}", "buyer") for i in range(2)]
        self.providers = [create_user(f"hp{n}_{i}", "provider") for i in range(2)]
        self.nodes = [
            Node.objects.create(
                owner=p,
                name=f"n{n}_{i}",
                price_per_gpu_hour=Decimal("3"),
                benchmark={"fp32_tflops": 10.0 * (i + 1)},
            )
            for i, p in enumerate(self.providers)
        ]
        self.credit = {b.pk: Decimal(0) for b in self.buyers}
        self.earnings = {p.pk: Decimal(0) for p in self.providers}
        self.escrow: dict[str, Decimal] = {}
        # open reservations: task id -> (job id, amount, node index, uploaded seconds or None)
        self.reserved: dict[object, tuple[str, Decimal, int, float | None]] = {}
        self.jobs: list[Job] = []
        self.results: list[TaskResult] = []
        self.payouts: list[Payout] = []
        # running payout holds (volunteer nodes, unverified results): result id -> (node
        # index, net, fee, buyer id)
        self.held: dict[int, tuple[int, Decimal, Decimal, int]] = {}
        self.rules = Rules.from_settings()

    @rule(who=st.integers(0, 1), amount=money)
    def grant(self, who: int, amount: Decimal) -> None:
        grant_credit(user=self.buyers[who], amount=amount, memo="p", operator=None)
        self.credit[self.buyers[who].pk] += amount

    @rule(who=st.integers(0, 1), budget=money)
    def submit(self, who: int, budget: Decimal) -> None:
        buyer = self.buyers[who]
        job = Job.objects.create(buyer=buyer, name="p", spec={"name": "p"}, budget=budget,
                                 max_price_per_gpu_hour=Decimal("5"))  # fmt: skip
        try:
            hold_budget(job)
        except InsufficientCredit:
            assert budget > self.credit[buyer.pk]
            job.status = JobStatus.FAILED  # a refused submission never runs
            job.save()
            return
        assert budget <= self.credit[buyer.pk]
        self.credit[buyer.pk] -= budget
        self.escrow[str(job.pk)] = budget
        self.jobs.append(job)

    @rule(who=st.integers(0, 1), leases=st.integers(0, 3), extra=st.integers(-1, 1))
    def submit_tight(self, who: int, leases: int, extra: int) -> None:
        """A job whose budget pays for a few leases, give or take 0.0001: the
        boundary where a lease must be refused."""
        bound = lease_bound(self.nodes[1], self.rules).gross
        budget = bound * leases + Decimal(extra) / 10**4  # a budget has four places
        if budget <= 0:
            return
        self.grant(who, budget)
        self.submit(who, budget)

    @rule(
        j=st.integers(0, 20), who=st.integers(0, 1), seconds=st.floats(0, 20000),
        cosine=st.none() | st.floats(-1, 1), credited=st.booleans(), caught=st.booleans(),
    )  # fmt: skip
    def work(self, j: int, who: int, seconds: float, cosine, credited: bool,
             caught: bool) -> None:  # fmt: skip
        active = [job for job in self.jobs if job.is_active]
        if not active:
            return
        job, node = active[j % len(active)], self.nodes[who]
        rnd = Round.objects.filter(job=job).first() or Round.objects.create(
            job=job, number=1, input_model_hash="x", input_model_file="x",
            deadline=timezone.now() + timedelta(hours=1),
        )  # fmt: skip
        task = Task.objects.create(round=rnd, seed=0, node=node, status="done",
                                   leased_at=timezone.now() - timedelta(seconds=seconds + 5),
                                   price_per_gpu_hour=node.price_per_gpu_hour)  # fmt: skip
        result = TaskResult.objects.create(task=task, node=node, update_file="u", update_hash="h",
                                           num_samples=1, compute_s=seconds, cosine=cosine,
                                           credited=credited, accepted=credited)  # fmt: skip
        if not credited:
            with pytest.raises(LedgerError, match="only verified work is paid"):
                charge_result(result)
            return
        expected = meter(reported_s=seconds, observed_s=seconds + 5, cosine=cosine,
                         fp32_tflops=node.benchmark["fp32_tflops"],
                         price_per_hour=node.price_per_gpu_hour, rules=self.rules)  # fmt: skip
        # a lease without a reservation may take only what no open reservation holds
        expected, _ = cap(expected, self.free(str(job.pk)), self.rules)
        tx = charge_result(result)
        if tx is not None:
            assert Decimal(tx.details["gross"]) == expected.gross
            self.escrow[str(job.pk)] -= expected.gross
            self.earnings[node.owner_id] += expected.net
            self.results.append(result)
            self._hold(result, who, tx)
            if caught:  # another result of the node fails a check now: a forfeiture
                self.fail_verification(who)

    def free(self, job_id: str) -> Decimal:
        held = sum((a for j, a, _, _ in self.reserved.values() if j == job_id), Decimal(0))
        return self.escrow[job_id] - held

    def _round(self, job: Job) -> Round:
        return Round.objects.filter(job=job).first() or Round.objects.create(
            job=job, number=1, input_model_hash="x", input_model_file="x",
            deadline=timezone.now() + timedelta(hours=1),
        )  # fmt: skip

    @rule(j=st.integers(0, 20), who=st.integers(0, 1))
    def lease(self, j: int, who: int) -> None:
        """The claim path's hook: a lease is made only if the job's free escrow covers it
        (the jobs tightest on money first: where a wrong answer would show)."""
        active = sorted((job for job in self.jobs if job.is_active),
                        key=lambda job: self.free(str(job.pk)))  # fmt: skip
        if not active:
            return
        job, node = active[j % len(active)], self.nodes[who]
        task = Task.objects.create(round=self._round(job), seed=0)
        bound = lease_bound(node, self.rules).gross
        with transaction.atomic():
            funds = Funds()
            ok = funds.affords(job.pk, node)
            if ok:
                Task.objects.filter(pk=task.pk).update(
                    status="leased", node=node, leased_at=timezone.now(),
                    price_per_gpu_hour=node.price_per_gpu_hour,
                )  # fmt: skip
                funds.reserve(task.pk, job.pk, node)
                funds.save()
        assert ok == (self.free(str(job.pk)) >= bound)
        if ok:
            self.reserved[task.pk] = (str(job.pk), bound, who, None)

    def _reserved(self, i: int, uploaded: bool) -> object | None:
        ids = [t for t, (_, _, _, s) in self.reserved.items() if (s is not None) == uploaded]
        return ids[i % len(ids)] if ids else None

    @rule(i=st.integers(0, 50), seconds=st.floats(0, 400))
    def upload(self, i: int, seconds: float) -> None:
        """An upload bills at most its compute seconds (never more than the lease allows):
        its reservation shrinks to that bound."""
        task_id = self._reserved(i, uploaded=False)
        if task_id is None:
            return
        job_id, amount, who, _ = self.reserved[task_id]
        node = self.nodes[who]
        lease_s = float(dj_settings.GPUFLEX["LEASE_TIMEOUT_S"])
        compute = min(seconds, lease_s)
        Task.objects.filter(pk=task_id).update(
            status="done", leased_at=timezone.now() - timedelta(seconds=seconds + 5)
        )
        TaskResult.objects.create(task_id=task_id, node=node, update_file="u", update_hash="h",
                                  num_samples=1, compute_s=compute)  # fmt: skip
        shrink_on_upload(task_id, compute)
        bound = lease_bound(node, self.rules)
        shrunk = max_charge(
            seconds=compute,
            speed=bound.speed,
            price_per_hour=node.price_per_gpu_hour,
            rules=self.rules,
        ).gross
        self.reserved[task_id] = (job_id, min(amount, shrunk), who, compute)

    @rule(i=st.integers(0, 50), cosine=st.none() | st.floats(-1, 1), credited=st.booleans())
    def settle(self, i: int, cosine, credited: bool) -> None:
        """Aggregation's verdict on an uploaded, reserved result: charged in full (never cut),
        or rejected and its reservation released."""
        task_id = self._reserved(i, uploaded=True)
        if task_id is None:
            return
        job_id, amount, who, compute = self.reserved.pop(task_id)
        result = TaskResult.objects.get(task_id=task_id)
        result.cosine, result.credited, result.accepted = cosine, credited, credited
        result.save()
        if not credited:
            release_unpaid(result)
            return
        node = self.nodes[who]
        expected = meter(reported_s=compute, observed_s=compute + 5, cosine=cosine,
                         fp32_tflops=node.benchmark["fp32_tflops"],
                         price_per_hour=node.price_per_gpu_hour, rules=self.rules)  # fmt: skip
        tx = charge_result(result)
        assert expected.gross <= amount  # what the reservation held covers the charge
        if expected.gross == 0:
            assert tx is None
            return
        assert Decimal(tx.details["gross"]) == expected.gross  # never capped
        assert Decimal(tx.details["shortfall"]) == 0
        self.escrow[job_id] -= expected.gross
        self.earnings[node.owner_id] += expected.net
        self.results.append(result)
        self._hold(result, who, tx)

    def _hold(self, result: TaskResult, who: int, tx) -> None:
        """A volunteer's unverified result: its net is held from payout."""
        buyer = Job.objects.get(pk=tx.job_id).buyer_id
        net, fee = Decimal(tx.details["net"]), Decimal(tx.details["fee"])
        self.held[result.pk] = (who, net, fee, buyer)

    def held_of(self, who: int) -> Decimal:
        return sum((net for i, net, _, _ in self.held.values() if i == who), Decimal(0))

    @rule(i=st.integers(0, 50))
    def verify_later(self, i: int) -> None:
        """A replica agrees with a held result after its charge: the hold ends."""
        if self.held:
            pk = sorted(self.held)[i % len(self.held)]
            TaskResult.objects.filter(pk=pk).update(verified=True)
            del self.held[pk]

    @rule(n=st.integers(0, 1))
    def fail_verification(self, n: int) -> None:
        """One of a node's results fails a check (a node with held earnings, when there is
        one): every running hold of it is forfeited, and the buyers get back what those
        charges cost them (net and fee)."""
        holding = sorted({i for i, *_ in self.held.values()})
        who = n if n in holding or not holding else holding[0]
        record_verification(self.nodes[who].pk, bad=1, caught=True)
        for pk, (i, net, fee, buyer) in list(self.held.items()):
            if i == who:
                self.earnings[self.providers[who].pk] -= net
                self.credit[buyer] += net + fee
                del self.held[pk]

    @rule(i=st.integers(0, 50))
    def lose(self, i: int) -> None:
        """A lease lost (expired, failed, reassigned) before its upload: released."""
        task_id = self._reserved(i, uploaded=False)
        if task_id is not None:
            release_tasks([task_id])
            del self.reserved[task_id]

    @rule(i=st.integers(0, 50))
    def recharge(self, i: int) -> None:
        if self.results:
            charge_result(self.results[i % len(self.results)])  # a retry: no change

    @rule(j=st.integers(0, 20), cancel=st.booleans())
    def end(self, j: int, cancel: bool) -> None:
        active = [job for job in self.jobs if job.is_active]
        if not active:
            return
        job = active[j % len(active)]
        job.status = JobStatus.CANCELLED if cancel else JobStatus.COMPLETED
        job.save()
        release_escrow(job)
        release_escrow(job)  # a retry
        self.credit[job.buyer_id] += self.escrow[str(job.pk)]
        self.escrow[str(job.pk)] = Decimal(0)
        # an ended job charges nothing more: its reservations go with its escrow
        self.reserved = {t: r for t, r in self.reserved.items() if r[0] != str(job.pk)}

    @rule(who=st.integers(0, 1), amount=st.decimals(min_value="0.5", max_value="20", places=3),
          key=st.sampled_from(["a", "b", "c"]))  # fmt: skip
    def payout(self, who: int, amount: Decimal, key: str) -> None:
        user = self.providers[who]
        seen = Payout.objects.filter(user=user, request_key=key).first()
        try:
            p = request_payout(user=user, amount=amount, wallet_address=WALLET,
                               idempotency_key=key)  # fmt: skip
        except LedgerError as exc:
            if seen is None:
                assert isinstance(exc, InvalidPayout)
                minimum = Decimal(str(self.rules_min()))
                assert amount < minimum or amount > self.earnings[user.pk] - self.held_of(who)
            else:
                assert seen.amount != amount  # a reused key for another amount
            return
        if seen is None:
            assert amount <= self.earnings[user.pk] - self.held_of(who)  # never held money
            self.earnings[user.pk] -= amount
            self.payouts.append(p)
        else:
            assert p.pk == seen.pk

    @rule(i=st.integers(0, 50), paid=st.booleans())
    def finish_payout(self, i: int, paid: bool) -> None:
        requested = [p for p in self.payouts if p.status == PayoutStatus.REQUESTED]
        if not requested:
            return
        p = requested[i % len(requested)]
        if paid:
            p.status = mark_payout_paid(p, reference="ref", operator=None).status
        else:
            p.status = reverse_payout(p, reason="bounced", operator=None).status
            self.earnings[p.user_id] += p.amount

    def rules_min(self) -> Decimal:
        from django.conf import settings as dj

        return Decimal(str(dj.GPUFLEX["MIN_PAYOUT"]))

    @invariant()
    def reconciles(self) -> None:
        if not hasattr(self, "buyers"):
            return
        report = reconcile(with_chain=False)
        assert report.ok, report.problems
        for b in self.buyers:
            assert balance(accounts.buyer_credit(b)) == self.credit[b.pk]
        for who, p in enumerate(self.providers):
            assert balance(accounts.provider_earnings(p)) == self.earnings[p.pk]
            assert holds.held(p) == self.held_of(who)  # node `who` is provider `who`'s
        for job in self.jobs:
            key = str(job.pk)
            assert balance(accounts.job_escrow(job)) == self.escrow[key]
            open_ = Reservation.objects.filter(job=job, state=ReservationState.OPEN)
            assert sorted(open_.values_list("amount", flat=True)) == sorted(
                a for j, a, _, _ in self.reserved.values() if j == key
            )
            # escrow always covers what its open leases could still be charged
            assert free_escrow([job.pk])[job.pk] == self.free(key) >= 0


def test_ledger_invariants_hold_under_random_operations(db) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
