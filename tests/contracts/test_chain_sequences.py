"""Random sequences of deposits, settlements, claims and refunds against a model of the escrow.

After every step the chain must agree with the model, and the contract must hold exactly the
open escrow plus the unclaimed part of posted batches: no step creates or loses money.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from contracts import ChainError, JobDebit, Payout, SettlementBatch
from tests.contracts.chain_env import Env

JOBS = ["s-job-0", "s-job-1", "s-job-2"]


@dataclass
class JobModel:
    buyer: str | None = None
    deposited: int = 0
    settled: int = 0
    refunded: int = 0
    closed: bool = False

    @property
    def remaining(self) -> int:
        return self.deposited - self.settled - self.refunded


@dataclass
class BatchModel:
    batch: SettlementBatch
    claimed: set[str] = field(default_factory=set)


class EscrowMachine(RuleBasedStateMachine):
    env: Env

    def __init__(self) -> None:
        super().__init__()
        self.snapshot = self.env.client.w3.testing.snapshot()
        self.jobs = {j: JobModel() for j in JOBS}
        self.batches: list[BatchModel] = []

    def teardown(self) -> None:
        self.env.client.w3.testing.revert(self.snapshot)

    @rule(job=st.sampled_from(JOBS), who=st.integers(0, 1), amount=st.integers(0, 1_000))
    def deposit(self, job: str, who: int, amount: int) -> None:
        buyer = (self.env.buyer, self.env.buyer2)[who]
        model = self.jobs[job]
        ok = amount > 0 and (model.buyer is None or (not model.closed and model.buyer == buyer))
        try:
            self.env.client.deposit(job, amount, buyer)
        except ChainError as exc:
            assert not ok, exc
            return
        assert ok
        model.buyer = model.buyer or buyer
        model.deposited += amount

    @rule(job=st.sampled_from(JOBS), amounts=st.lists(st.integers(1, 400), min_size=1, max_size=3))
    def settle(self, job: str, amounts: list[int]) -> None:
        model = self.jobs[job]
        ok = model.buyer is not None and not model.closed and sum(amounts) <= model.remaining
        batch = SettlementBatch.build(
            f"s-batch-{len(self.batches)}-{job}-{amounts}",
            [Payout(p, a) for p, a in zip(self.env.providers, amounts, strict=False)],
            [JobDebit(job, sum(amounts))],
        )
        try:
            self.env.client.post_batch(batch)
        except ChainError as exc:
            assert not ok, exc
            return
        assert ok
        model.settled += sum(amounts)
        self.batches.append(BatchModel(batch))

    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        if not self.batches:
            return
        entry = data.draw(st.sampled_from(self.batches))
        provider, amount = data.draw(st.sampled_from(entry.batch.payouts))
        before = self.env.balance(provider)
        try:
            self.env.client.claim(entry.batch.proof_for(provider), sender=self.env.outsider)
        except ChainError as exc:
            assert provider in entry.claimed and exc.name == "AlreadyClaimed", exc
            return
        assert provider not in entry.claimed
        entry.claimed.add(provider)
        assert self.env.balance(provider) - before == amount

    @rule(job=st.sampled_from(JOBS))
    def refund(self, job: str) -> None:
        model = self.jobs[job]
        ok = model.buyer is not None and not model.closed
        before = self.env.balance(model.buyer) if model.buyer else 0
        try:
            record = self.env.client.refund(job)
        except ChainError as exc:
            assert not ok, exc
            return
        assert ok and model.buyer is not None
        assert record.amount == model.remaining
        assert self.env.balance(model.buyer) - before == model.remaining
        model.refunded += model.remaining
        model.closed = True

    @invariant()
    def chain_matches_model_and_money_is_conserved(self) -> None:
        c = self.env.client
        for job, model in self.jobs.items():
            state = c.job(job)
            assert (state.deposited, state.settled, state.refunded, state.closed) == (
                model.deposited,
                model.settled,
                model.refunded,
                model.closed,
            )
        unclaimed = sum(
            amount
            for entry in self.batches
            for provider, amount in entry.batch.payouts
            if provider not in entry.claimed
        )
        escrow = sum(m.remaining for m in self.jobs.values())
        assert self.env.balance(c.escrow.address) == escrow + unclaimed


def test_random_sequences_conserve_money(_deployed: Env) -> None:
    machine = type("Machine", (EscrowMachine,), {"env": _deployed})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=10,
            stateful_step_count=15,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
