"""Payout holds (docs/money.md, "Cheating does not pay"): a volunteer's earnings for work no
replica checked are held for PAYOUT_HOLD_S and forfeited, to the buyers who paid for them,
when one of its results fails verification; verified work and platform nodes are not held."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from marketplace.jobs.models import Job
from marketplace.ledger import accounts, holds
from marketplace.ledger.models import EarningsHold, HoldState, Payout, Transaction, TxKind
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.selectors import balances, node_earnings
from marketplace.nodes.enrollment import create_enrollment_token
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.rounds.models import Task, TaskResult
from tests.marketplace.agents import Agent
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC, client_for
from tests.marketplace.test_ledger_jobs import work_all

pytestmark = pytest.mark.django_db(transaction=True)

WALLET = "0x" + "cd" * 20
HOLD_S = 7 * 24 * 3600
# one task per job: one shard, one round
ONE_TASK = SMALL_SPEC | {
    "sharding": {"method": "random", "num_shards": 1},
    "rounds": {"max_rounds": 1},
}
_names = itertools.count()


@pytest.fixture(autouse=True)
def rates(settings):
    """Trusted volunteers are never spot-checked unless a test says so; any payout size."""
    settings.GPUFLEX = settings.GPUFLEX | {
        "REPLICATION_SHARE": 0.0,
        "PLATFORM_SPOT_CHECK_RATE": 0.0,
        "PAYOUT_HOLD_S": float(HOLD_S),
        "MIN_PAYOUT": Decimal("0"),
    }


@pytest.fixture
def clock(monkeypatch):
    """The holds' clock, moved by the test (no sleeping): `clock.advance(seconds)`."""

    class Clock:
        offset = timedelta(0)

        def advance(self, seconds: float) -> None:
            self.offset += timedelta(seconds=seconds)

    c = Clock()
    real = holds.now
    monkeypatch.setattr(holds, "now", lambda: real() + c.offset)
    return c


def node_of(make_user, kind: str = "volunteer", trusted: bool = False) -> tuple[Agent, APIClient]:
    """A node of a provider of its own (so that earnings accounts are not shared)."""
    _, key = make_user("provider")
    owner = client_for(key)
    body = {
        "name": f"hold-node-{next(_names)}",
        "kind": kind,
        "hardware": HARDWARE,
        "benchmark": {"fp32_tflops": 80},
        "network": {"rtt_ms": 20, "up_mbps": 100, "down_mbps": 300},
        "price_per_gpu_hour": "0.40",
        "availability": {"hours": "always"},
    }
    if kind == "platform":
        body["enrollment_token"] = create_enrollment_token(operator=None)[1]
    response = owner.post("/api/v1/nodes/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    if trusted:  # past TRUST_AFTER_VERIFIED: replicated only at REPLICATION_SHARE
        Node.objects.filter(pk=data["id"]).update(verified_ok=10, reliability=0.9)
    return Agent(APIClient(), data["id"], data["node_key"]), owner


def earned(agent: Agent) -> Decimal:
    return balance(accounts.provider_earnings(Node.objects.get(pk=agent.node_id).owner_id))


def charges_of(agent: Agent) -> list[Transaction]:
    return list(Transaction.objects.filter(kind=TxKind.CHARGE, node_id=agent.node_id))


def payout(owner: APIClient, amount: Decimal, key: str) -> Any:
    body = {"amount": str(amount), "wallet_address": WALLET}
    return owner.post("/api/v1/payouts/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_unverified_earnings_are_held_then_released_when_the_hold_ends(
    make_user, submit, clock
) -> None:
    agent, owner = node_of(make_user, trusted=True)
    submit(tier="volunteer", spec=ONE_TASK)
    assert work_all([agent]) == 1
    assert not Task.objects.filter(replica__gt=0).exists(), "a trusted node, not spot-checked"
    (charge,) = charges_of(agent)
    net = Decimal(charge.details["net"])
    assert net > 0 and earned(agent) == net

    hold = EarningsHold.objects.get(charge=charge)
    assert charge.created_at <= hold.until - timedelta(seconds=HOLD_S) <= holds.now()
    money = owner.get("/api/v1/ledger/earnings").json()
    assert (money["balance"], money["held"], money["available"]) == (str(net), str(net), "0.000000")
    assert money["releases"] == [{"date": hold.until.date().isoformat(), "amount": str(net)}]
    assert node_earnings(Node.objects.get(pk=agent.node_id))["held"] == str(net)

    refused = payout(owner, net, "early")
    assert refused.status_code == 400, refused.content
    body = refused.json()
    assert body["error"] == "invalid_payout" and body["held"] == str(net)
    assert f"{net} more is on hold" in body["detail"]
    assert f"released at {hold.until:%Y-%m-%d %H:%M} UTC" in body["detail"]
    assert "GPUFLEX_PAYOUT_HOLD_S" in body["detail"]
    assert not Payout.objects.exists() and earned(agent) == net

    clock.advance(HOLD_S - 60)  # a minute before the end: still held
    assert holds.held(hold.user_id) == net and payout(owner, net, "almost").status_code == 400
    clock.advance(61)  # the hold is over: nothing had to run for it to end
    after = balances(hold.user)
    assert (after.earnings_held, after.earnings_available) == (Decimal("0.000000"), net)
    assert payout(owner, net, "after").status_code == 201
    assert earned(agent) == 0 and reconcile(with_chain=False).ok


def test_verified_results_and_platform_nodes_are_not_held(make_user, submit) -> None:
    first, _ = node_of(make_user)  # new volunteers: every task replicated, so verified
    second, _ = node_of(make_user)
    submit(tier="volunteer", spec=ONE_TASK)
    assert work_all([first, second]) == 2
    results = TaskResult.objects.all()
    assert results.count() == 2 and all(r.verified is True for r in results)
    for agent in (first, second):
        assert charges_of(agent) and earned(agent) > 0
        owner = Node.objects.get(pk=agent.node_id).owner
        assert balances(owner).earnings_available == earned(agent)

    platform, _ = node_of(make_user, kind="platform")
    submit(tier="platform", spec=ONE_TASK)
    assert work_all([platform]) == 1
    assert TaskResult.objects.get(node_id=platform.node_id).verified is None  # unchecked
    assert earned(platform) > 0
    assert not EarningsHold.objects.exists(), "verified work and platform work are not held"


def test_a_verified_replica_releases_a_hold_at_once(make_user, submit) -> None:
    agent, owner = node_of(make_user, trusted=True)
    submit(tier="volunteer", spec=ONE_TASK)
    work_all([agent])
    (hold,) = EarningsHold.objects.all()
    assert holds.held(hold.user_id) == hold.amount
    # a check that agrees after the charge (a spot check picks its segment after the upload)
    TaskResult.objects.filter(pk=hold.charge.task_result_id).update(verified=True)
    assert holds.held(hold.user_id) == 0 and holds.available(hold.user_id) == hold.amount
    assert payout(owner, hold.amount, "verified").status_code == 201


def test_a_failed_verification_forfeits_held_earnings_refunds_the_buyers_and_resets_trust(
    make_user, submit, settings
) -> None:
    cheater, _ = node_of(make_user, trusted=True)
    honest, _ = node_of(make_user, trusted=True)
    verifier, _ = node_of(make_user, kind="platform")
    first, second, third = (client_for(make_user("buyer")[1]) for _ in range(3))
    # the cheater first earns on two buyers' jobs (held: nobody checked them), the honest too
    jobs = [submit(tier="volunteer", spec=ONE_TASK, client=c) for c in (first, second)]
    work_all([cheater])
    submit(tier="volunteer", spec=ONE_TASK, client=third)
    work_all([honest])
    held = {h.job_id: h for h in EarningsHold.objects.filter(node_id=cheater.node_id)}
    assert len(held) == 2 and all(h.state == HoldState.HELD for h in held.values())
    honest_held = holds.held_for_node(honest.node_id)
    assert honest_held > 0
    buyers = [Job.objects.get(pk=j["id"]).buyer for j in jobs]
    credit = [balance(accounts.buyer_credit(b)) for b in buyers]

    # then it cheats on a job where its task is checked: the replica and a platform node
    # outvote it, and rounds/verification.py records the failure
    settings.GPUFLEX = settings.GPUFLEX | {"REPLICATION_SHARE": 1.0}
    submit(tier="volunteer", spec=ONE_TASK, client=third)
    work_all([cheater, honest, verifier], cheaters=[cheater])
    assert TaskResult.objects.filter(node_id=cheater.node_id, verified=False).count() == 1

    forfeited = EarningsHold.objects.filter(node_id=cheater.node_id)
    assert all(h.state == HoldState.FORFEITED for h in forfeited)
    forfeit = Transaction.objects.get(kind=TxKind.FORFEIT)
    assert forfeit.node_id == cheater.node_id and forfeit.details["holds"] == 2
    assert {h.forfeit_id for h in forfeited} == {forfeit.pk}
    legs = {e.account.code: e.amount for e in forfeit.entries.select_related("account")}
    owner = Node.objects.get(pk=cheater.node_id).owner_id
    assert legs.pop(f"earnings:{owner}") == -sum(h.amount for h in held.values())
    assert legs.pop("platform:fees") == -sum(h.fee for h in held.values())
    for client, buyer, before, job in zip((first, second), buyers, credit, jobs, strict=True):
        hold = held[uuid.UUID(job["id"])]
        # each buyer gets back what the charge cost it: the provider's share and the fee
        assert legs.pop(f"buyer:{buyer.pk}") == hold.amount + hold.fee
        assert balance(accounts.buyer_credit(buyer)) == before + hold.amount + hold.fee
        costs = client.get(f"/api/v1/jobs/{job['id']}/").json()["costs"]
        assert Decimal(costs["forfeited"]) == hold.amount + hold.fee
    assert not legs
    assert earned(cheater) == 0, "everything it had earned was still held"
    me = node_earnings(Node.objects.get(pk=cheater.node_id))
    assert me["held"] == "0.000000"
    assert Decimal(me["forfeited"]) == sum(h.amount for h in held.values())
    # the honest node lost nothing: its replica was verified, its earlier work still held
    assert holds.held_for_node(honest.node_id) >= honest_held
    assert not EarningsHold.objects.filter(node_id=honest.node_id, state=HoldState.FORFEITED)
    report = reconcile(with_chain=False)
    assert report.ok, report.problems

    # trust is gone: with spot checks off, its next task is still replicated
    settings.GPUFLEX = settings.GPUFLEX | {"REPLICATION_SHARE": 0.0}
    job = submit(tier="volunteer", spec=ONE_TASK, client=third)
    assert cheater.claim() is not None
    assert Task.objects.filter(round__job_id=job["id"], replica=1).exists()


def test_a_failure_proven_by_re_execution_forfeits_once(make_user, submit) -> None:
    """A segment check (or a replica majority) calls record_verification(node, bad=1,
    caught=True): the held earnings go, once; a second failure finds nothing more to take.
    The statistical filter's or the privacy check's failure (caught=False) costs trust, not
    money: an honest node's non-IID update can trip them."""
    agent, _ = node_of(make_user, trusted=True)
    submit(tier="volunteer", spec=ONE_TASK)
    work_all([agent])
    (hold,) = EarningsHold.objects.all()
    fees = balance(accounts.platform_fees())

    record_verification(agent.node_id, bad=1, reason="filtered as an outlier")
    assert not Transaction.objects.filter(kind=TxKind.FORFEIT).exists()
    assert holds.held_for_node(agent.node_id) == hold.amount
    record_verification(agent.node_id, ok=0, bad=1, reason="segment 3 did not reproduce",
                        caught=True)  # fmt: skip
    forfeit = Transaction.objects.get(kind=TxKind.FORFEIT)
    assert forfeit.details["reason"] == "segment 3 did not reproduce"
    assert "segment 3" in forfeit.memo and earned(agent) == 0
    assert balance(accounts.platform_fees()) == fees - hold.fee
    assert holds.forfeit_held(agent.node_id, "again") == 0
    record_verification(agent.node_id, ok=0, bad=1, caught=True)
    assert Transaction.objects.filter(kind=TxKind.FORFEIT).count() == 1
    assert reconcile(with_chain=False).ok


def test_an_honest_node_keeps_its_held_earnings_whatever_others_do(make_user, submit) -> None:
    honest, _ = node_of(make_user, trusted=True)
    other, _ = node_of(make_user, trusted=True)
    submit(tier="volunteer", spec=ONE_TASK)
    submit(tier="volunteer", spec=ONE_TASK)
    work_all([honest, other])
    mine = holds.held_for_node(honest.node_id)
    assert mine > 0
    record_verification(other.node_id, bad=1, caught=True)  # the other node fails
    record_verification(honest.node_id, ok=1)  # its own checks pass
    assert holds.held_for_node(honest.node_id) == mine == earned(honest)
    assert holds.forfeit_held(other.node_id, "again") == 0
    assert not EarningsHold.objects.filter(node_id=honest.node_id, state=HoldState.FORFEITED)


def test_a_payout_may_take_what_no_hold_keeps(make_user, submit, clock) -> None:
    agent, owner = node_of(make_user, trusted=True)
    submit(tier="volunteer", spec=ONE_TASK)
    work_all([agent])
    clock.advance(HOLD_S + 1)  # the first job's earnings are free
    free = earned(agent)
    submit(tier="volunteer", spec=ONE_TASK)
    work_all([agent])
    total = earned(agent)
    assert total > free and holds.available(Node.objects.get(pk=agent.node_id).owner_id) == free
    assert payout(owner, total, "all").status_code == 400
    assert payout(owner, free, "free").status_code == 201
    assert earned(agent) == total - free and reconcile(with_chain=False).ok


@pytest.fixture
def chain(settings):
    """The in-process EVM as the money rail (tests/marketplace/test_ledger_chain.py)."""
    pytest.importorskip("eth_tester")
    from contracts import ChainClient
    from marketplace.ledger import chain as ledger_chain
    from tests.marketplace.chain_payouts import UPC

    settings.CHAIN = settings.CHAIN | {"URL": "embedded", "UNITS_PER_CREDIT": UPC}
    client = ChainClient.embedded()
    ledger_chain.use_client(client)
    yield client
    ledger_chain.use_client(None)


def test_on_chain_a_forfeited_charge_is_the_buyers_to_withdraw_again(
    chain, make_user, submit
) -> None:
    """A refunded charge no longer counts as spent deposit: the buyer may take it back."""
    from marketplace.ledger import chain as ledger_chain
    from tests.marketplace.chain_payouts import UPC

    buyer_user, key = make_user("buyer")
    buyer = client_for(key)
    address = chain.w3.eth.accounts[2]
    wallet = buyer.put("/api/v1/ledger/wallet", {"address": address}, format="json").json()
    chain.deposit(wallet["funding_id"], 30 * UPC, sender=address)
    assert ledger_chain.sync_deposits(chain) == 1
    agent, _ = node_of(make_user, trusted=True)
    submit(tier="volunteer", spec=ONE_TASK, client=buyer)
    work_all([agent])
    (hold,) = EarningsHold.objects.all()
    assert ledger_chain.withdrawable(buyer_user) == 30 - hold.amount - hold.fee

    record_verification(agent.node_id, bad=1, caught=True)
    assert ledger_chain.withdrawable(buyer_user) == 30
    report = reconcile()
    assert report.ok, report.problems
