"""Deposits, settlement batches, claims and refunds on the escrow contract."""

from __future__ import annotations

import pytest

from contracts import ChainError, JobDebit, Payout, SettlementBatch, to_bytes32
from contracts.merkle import MerkleTree, leaf_hash
from contracts.records import NATIVE
from contracts.settlement import ClaimProof
from tests.contracts.chain_env import ETH, STABLE_DECIMALS, Env

USD = 10**STABLE_DECIMALS

# ------------------------------------------------------------------ deposits


def test_native_deposit_is_escrowed_and_reported(env: Env) -> None:
    c = env.client
    start = c.block_number + 1
    before = env.balance(c.escrow.address)
    c.deposit("job-a", 2 * ETH, env.buyer)
    c.deposit("job-a", 1 * ETH, env.buyer)

    assert env.balance(c.escrow.address) - before == 3 * ETH
    job = c.job("job-a")
    assert (job.buyer, job.token, job.deposited, job.remaining) == (
        env.buyer,
        NATIVE,
        3 * ETH,
        3 * ETH,
    )
    records = c.deposits(from_block=start)
    assert [(r.job_id, r.buyer, r.token, r.amount) for r in records] == [
        (to_bytes32("job-a"), env.buyer, NATIVE, 2 * ETH),
        (to_bytes32("job-a"), env.buyer, NATIVE, 1 * ETH),
    ]
    assert len({r.ref.key for r in records}) == 2  # distinct keys: credit each exactly once


def test_erc20_deposit_is_escrowed_and_reported(env: Env) -> None:
    c, token = env.client, env.token.address
    start = c.block_number + 1
    c.deposit("job-usd", 250 * USD, env.buyer, token=token)

    assert env.balance(c.escrow.address, token) == 250 * USD
    assert c.job("job-usd").token == token
    (record,) = c.deposits(from_block=start)
    assert (record.token, record.amount, record.buyer) == (token, 250 * USD, env.buyer)


def test_deposit_scan_by_block_range(env: Env) -> None:
    c = env.client
    c.deposit("j1", 1, env.buyer)
    middle = c.block_number
    c.deposit("j2", 2, env.buyer)
    assert [r.amount for r in c.deposits(to_block=middle) if r.job_id == to_bytes32("j1")] == [1]
    assert [r.amount for r in c.deposits(from_block=middle + 1)] == [2]


def test_deposit_rules(env: Env) -> None:
    c, token = env.client, env.token.address
    with pytest.raises(ChainError, match="ZeroAmount"):
        c.deposit("job", 0, env.buyer)
    c.deposit("job", ETH, env.buyer)
    # A job belongs to its first depositor, in its first currency.
    with pytest.raises(ChainError, match="NotJobBuyer"):
        c.deposit("job", ETH, env.buyer2)
    with pytest.raises(ChainError, match="WrongJobToken"):
        c.deposit("job", USD, env.buyer, token=token)
    c.refund("job")
    with pytest.raises(ChainError, match="JobClosed"):
        c.deposit("job", ETH, env.buyer)


def test_only_allowed_tokens_can_be_deposited(env: Env) -> None:
    c = env.client
    other = c.deploy_contract("MockERC20", "Junk", "JNK", 18, sender=env.admin)
    c.transact(other.functions.mint(env.buyer, 10**18), env.admin)
    with pytest.raises(ChainError, match="TokenNotAllowed"):
        c.deposit("job", 10**18, env.buyer, token=other.address)
    with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
        c.transact(c.escrow.functions.setTokenAllowed(other.address, True), env.operator)
    c.allow_token(other.address)
    c.deposit("job", 10**18, env.buyer, token=other.address)
    c.allow_token(other.address, False)
    with pytest.raises(ChainError, match="TokenNotAllowed"):
        c.deposit("job2", 10**18, env.buyer, token=other.address)


# ------------------------------------------------------------------ settlement and claims


@pytest.mark.parametrize("currency", ["native", "erc20"])
def test_batch_settles_and_every_provider_claims_once(env: Env, currency: str) -> None:
    c = env.client
    token = NATIVE if currency == "native" else env.token.address
    unit = ETH if token == NATIVE else USD
    c.deposit("job", 10 * unit, env.buyer, token=token)
    amounts = [3 * unit, 2 * unit, 1 * unit]
    start = c.block_number + 1
    batch = env.settle("batch-1", "job", amounts, token=token)

    job = c.job("job")
    assert (job.settled, job.remaining) == (6 * unit, 4 * unit)
    state = c.batch_state("batch-1")
    assert state is not None and (state.root, state.total, state.claimed) == (
        batch.root,
        6 * unit,
        0,
    )
    for provider, amount in zip(env.providers, amounts, strict=False):
        before = env.balance(provider, token)
        proof = batch.proof_for(provider)
        record = c.claim(proof, sender=env.outsider)  # relayed: the money still goes to provider
        assert (record.provider, record.amount, record.token) == (provider, amount, token)
        assert env.balance(provider, token) - before == amount
        assert c.is_claimed(proof)
    assert c.batch_state("batch-1").claimed == 6 * unit  # type: ignore[union-attr]
    assert [(r.provider, r.amount) for r in c.claims(from_block=start)] == list(
        zip(env.providers, amounts, strict=False)
    )


def test_double_claim_rejected(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    batch = env.settle("b", "job", [6, 4])
    proof = batch.proof_for(env.providers[0])
    c.claim(proof)
    before = env.balance(env.providers[0])
    with pytest.raises(ChainError, match="AlreadyClaimed"):
        c.claim(proof, sender=env.outsider)
    assert env.balance(env.providers[0]) == before


def test_claim_with_wrong_proof_rejected(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    batch = env.settle("b", "job", [6, 3, 1])
    good = batch.proof_for(env.providers[0])
    other = batch.proof_for(env.providers[1])
    # Someone else's proof, a truncated proof, an empty one, a proof from another batch.
    for proof in (other.proof, good.proof[:-1], (), (b"\x11" * 32,) * len(good.proof)):
        bad = ClaimProof(good.batch_id, good.provider, good.token, good.amount, tuple(proof))
        with pytest.raises(ChainError, match="InvalidProof"):
            c.claim(bad)
    c.deposit("job2", 10, env.buyer)
    second = env.settle("b2", "job2", [5, 5])
    stolen = ClaimProof(
        second.batch_id, good.provider, good.token, good.amount, good.proof
    )  # right leaf, wrong batch
    with pytest.raises(ChainError, match="InvalidProof"):
        c.claim(stolen)


def test_claim_of_wrong_amount_or_provider_rejected(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    batch = env.settle("b", "job", [6, 4])
    good = batch.proof_for(env.providers[0])
    for amount in (good.amount + 1, good.amount - 1, 10):
        bad = ClaimProof(good.batch_id, good.provider, good.token, amount, good.proof)
        with pytest.raises(ChainError, match="InvalidProof"):
            c.claim(bad)
    thief = ClaimProof(good.batch_id, env.outsider, good.token, good.amount, good.proof)
    with pytest.raises(ChainError, match="InvalidProof"):
        c.claim(thief)
    with pytest.raises(ChainError, match="UnknownBatch"):
        c.claim(ClaimProof(to_bytes32("nope"), good.provider, good.token, 6, good.proof))
    c.claim(good)  # the genuine claim still works afterwards


def test_batch_cannot_overdraw_its_escrow(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    with pytest.raises(ChainError, match="InsufficientEscrow"):
        env.settle("b", "job", [6, 5])
    env.settle("b", "job", [6, 4])
    assert c.job("job").remaining == 0
    with pytest.raises(ChainError, match="InsufficientEscrow"):
        env.settle("b2", "job", [1])


def test_claims_beyond_a_batch_total_are_refused(env: Env) -> None:
    # A wrong root (leaves worth more than the debits) must not reach other jobs' escrow.
    c = env.client
    c.deposit("other-job", 100, env.buyer2)
    c.deposit("job", 10, env.buyer)
    p0, p1 = env.providers[:2]
    tree = MerkleTree([leaf_hash(p0, NATIVE, 8), leaf_hash(p1, NATIVE, 8)])
    c.transact(
        c.escrow.functions.postBatch(
            to_bytes32("bad"), tree.root, NATIVE, [to_bytes32("job")], [10]
        ),
        env.operator,
    )
    first = ClaimProof(
        to_bytes32("bad"), p0, NATIVE, 8, tuple(tree.proof(leaf_hash(p0, NATIVE, 8)))
    )
    c.claim(first)
    second = ClaimProof(
        to_bytes32("bad"), p1, NATIVE, 8, tuple(tree.proof(leaf_hash(p1, NATIVE, 8)))
    )
    with pytest.raises(ChainError, match="BatchOverdrawn"):
        c.claim(second)


def test_batch_rules(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    c.deposit("usd-job", 10 * USD, env.buyer, token=env.token.address)
    env.settle("b", "job", [1])
    with pytest.raises(ChainError, match="BatchExists"):  # a retried post never debits twice
        env.settle("b", "job", [1])
    assert c.job("job").settled == 1
    with pytest.raises(ChainError, match="WrongJobToken"):  # batch pays native, job holds USD
        env.settle("b2", "usd-job", [1])
    with pytest.raises(ChainError, match="UnknownJob"):
        env.settle("b3", "no-such-job", [1])
    esc = c.escrow.functions
    with pytest.raises(ChainError, match="ZeroRoot"):
        c.transact(
            esc.postBatch(to_bytes32("z"), b"\0" * 32, NATIVE, [to_bytes32("job")], [1]),
            env.operator,
        )
    with pytest.raises(ChainError, match="LengthMismatch"):
        c.transact(
            esc.postBatch(to_bytes32("z"), b"\1" * 32, NATIVE, [to_bytes32("job")], []),
            env.operator,
        )
    with pytest.raises(ChainError, match="EmptyBatch"):
        c.transact(esc.postBatch(to_bytes32("z"), b"\1" * 32, NATIVE, [], []), env.operator)
    c.refund("job")
    with pytest.raises(ChainError, match="JobClosed"):
        env.settle("b4", "job", [1])


def test_one_batch_can_settle_several_jobs(env: Env) -> None:
    c = env.client
    c.deposit("j1", 10, env.buyer)
    c.deposit("j2", 10, env.buyer2)
    p0, p1 = env.providers[:2]
    batch = SettlementBatch.build(
        "multi",
        [Payout(p0, 9), Payout(p1, 5), Payout(p0, 1)],
        [JobDebit("j1", 7), JobDebit("j2", 8)],
    )
    assert batch.amount_for(p0) == 10  # aggregated to one leaf per provider
    c.post_batch(batch)
    assert (c.job("j1").remaining, c.job("j2").remaining) == (3, 2)
    c.claim(batch.proof_for(p0))
    c.claim(batch.proof_for(p1))


# ------------------------------------------------------------------ refunds


@pytest.mark.parametrize("currency", ["native", "erc20"])
def test_refund_returns_only_what_remains_to_the_depositor_once(env: Env, currency: str) -> None:
    c = env.client
    token = NATIVE if currency == "native" else env.token.address
    c.deposit("job", 1000, env.buyer, token=token)
    env.settle("b", "job", [300, 100], token=token)
    before = env.balance(env.buyer, token)
    start = c.block_number + 1

    record = c.refund("job")
    assert (record.buyer, record.token, record.amount) == (env.buyer, token, 600)
    assert env.balance(env.buyer, token) - before == 600
    job = c.job("job")
    assert (job.closed, job.remaining, job.refunded) == (True, 0, 600)
    assert [(r.job_id, r.amount) for r in c.refunds(from_block=start)] == [(to_bytes32("job"), 600)]
    with pytest.raises(ChainError, match="JobClosed"):
        c.refund("job")
    assert env.balance(env.buyer, token) - before == 600
    with pytest.raises(ChainError, match="UnknownJob"):
        c.refund("never-deposited")


def test_refund_leaves_settled_money_for_the_providers(env: Env) -> None:
    c = env.client
    c.deposit("job", 1000, env.buyer)
    batch = env.settle("b", "job", [700])
    c.refund("job")  # the job ends before the provider claims
    before = env.balance(env.providers[0])
    c.claim(batch.proof_for(env.providers[0]), sender=env.outsider)
    assert env.balance(env.providers[0]) - before == 700
    assert env.balance(c.escrow.address) == 0


def test_refund_of_a_fully_spent_job_pays_nothing_and_closes(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    env.settle("b", "job", [10])
    assert c.refund("job").amount == 0
    assert c.job("job").closed


# ------------------------------------------------------------------ access control


def test_only_the_operator_posts_refunds_and_anchors(env: Env) -> None:
    c = env.client
    c.deposit("job", 10, env.buyer)
    esc, prov = c.escrow.functions, c.provenance.functions
    job, root = to_bytes32("job"), b"\1" * 32
    for intruder in (env.admin, env.buyer, env.outsider, env.providers[0]):
        calls = (
            esc.postBatch(to_bytes32("b"), root, NATIVE, [job], [1]),
            esc.refund(job),
            prov.anchor(job, 0, root),
            c.nodes.functions.deactivate(env.providers[0]),
        )
        for call in calls:
            with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
                c.transact(call, intruder)
    assert c.job("job").settled == 0 and not c.job("job").closed


def test_admin_manages_roles(env: Env) -> None:
    c = env.client
    from contracts.client import OPERATOR_ROLE

    assert c.has_role(c.escrow, OPERATOR_ROLE, env.operator)
    assert not c.has_role(c.escrow, OPERATOR_ROLE, env.admin)
    with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
        c.transact(c.escrow.functions.grantRole(OPERATOR_ROLE, env.outsider), env.operator)
    c.transact(c.escrow.functions.grantRole(OPERATOR_ROLE, env.outsider), env.admin)
    c.deposit("job", 10, env.buyer)
    c.transact(c.escrow.functions.refund(to_bytes32("job")), env.outsider)
    c.transact(c.escrow.functions.revokeRole(OPERATOR_ROLE, env.outsider), env.admin)
    c.deposit("job2", 10, env.buyer)
    with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
        c.transact(c.escrow.functions.refund(to_bytes32("job2")), env.outsider)


# ------------------------------------------------------------------ events


def test_every_state_change_emits_its_event(env: Env) -> None:
    c = env.client
    esc = c.escrow.events
    start = c.block_number + 1
    c.deposit("job", 10, env.buyer)
    batch = env.settle("b", "job", [4])
    c.claim(batch.proof_for(env.providers[0]))
    c.refund("job")
    c.allow_token(env.token.address, False)

    def logs(event: object) -> list[dict[str, object]]:
        return [dict(e["args"]) for e in event.get_logs(from_block=start)]  # type: ignore[attr-defined]

    job, bid = to_bytes32("job"), to_bytes32("b")
    assert logs(esc.Deposited()) == [
        {"jobId": job, "buyer": env.buyer, "token": NATIVE, "amount": 10}
    ]
    assert logs(esc.BatchPosted()) == [
        {"batchId": bid, "root": batch.root, "token": NATIVE, "total": 4}
    ]
    assert logs(esc.JobDebited()) == [{"jobId": job, "batchId": bid, "amount": 4}]
    assert logs(esc.Claimed()) == [
        {"batchId": bid, "provider": env.providers[0], "token": NATIVE, "amount": 4}
    ]
    assert logs(esc.Refunded()) == [
        {"jobId": job, "buyer": env.buyer, "token": NATIVE, "amount": 6}
    ]
    assert logs(esc.TokenAllowed()) == [{"token": env.token.address, "allowed": False}]


# ------------------------------------------------------------------ reconciliation


def test_contract_balance_equals_open_escrow_plus_unclaimed_batches(env: Env) -> None:
    c = env.client
    c.deposit("j1", 1000, env.buyer)
    c.deposit("j2", 500, env.buyer2)
    c.deposit("j3", 300, env.buyer)
    b1 = env.settle("b1", "j1", [200, 100, 50])
    b2 = SettlementBatch.build(
        "b2", [Payout(env.providers[0], 120)], [JobDebit("j2", 100), JobDebit("j3", 20)]
    )
    c.post_batch(b2)
    c.claim(b1.proof_for(env.providers[1]))
    c.claim(b2.proof_for(env.providers[0]))
    c.refund("j3")

    jobs = [c.job(j) for j in ("j1", "j2", "j3")]
    batches = [c.batch_state(b) for b in ("b1", "b2")]
    unclaimed = sum(b.total - b.claimed for b in batches if b is not None)
    assert env.balance(c.escrow.address) == sum(j.remaining for j in jobs) + unclaimed
    assert (sum(j.remaining for j in jobs), unclaimed) == (650 + 400, 250)
