"""Anchoring and settlement on chain, end to end: a completed job's provenance head anchored
once and checked by `gpuflex verify` against the chain; settlement batches closing on a count
or a deadline, each anchoring its contribution root, with proofs a provider can check; buyers
and the operator withdrawing on chain (pull), a contract buyer that refuses native currency
included; all reconciled with the ledger. On the in-process EVM and on Hardhat's node."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import httpx
import pytest

pytest.importorskip("eth_tester")

from django.core.wsgi import get_wsgi_application

from contracts import ChainClient, ChainError, ClaimProof, ContributionProof
from marketplace import cli
from marketplace.client import Client
from marketplace.ledger import accounts, anchoring
from marketplace.ledger import chain as ledger_chain
from marketplace.ledger.models import Payout, ProvenanceAnchor, Transaction
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.verify import check_contribution, verify_download
from tests.marketplace.chain_payouts import (
    UPC,
    configure_rpc,
    earn_from_a_paid_job,
    register_wallet,
    restart,
)
from tests.marketplace.helpers import client_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["embedded", "rpc"])
def chain(request, settings):
    settings.GPUFLEX = settings.GPUFLEX | {"MIN_PAYOUT": "0.01"}
    if request.param == "embedded":
        settings.CHAIN = settings.CHAIN | {"URL": "embedded", "UNITS_PER_CREDIT": UPC}
        client = ChainClient.embedded()
        ledger_chain.use_client(client)
        yield client
        ledger_chain.use_client(None)
        return
    yield from _rpc(settings, request.getfixturevalue("rpc_chain"))


@pytest.fixture
def rpc(settings, rpc_chain):
    """Hardhat's node only: what a buyer checks with its own JSON-RPC URL."""
    settings.GPUFLEX = settings.GPUFLEX | {"MIN_PAYOUT": "0.01"}
    for client in _rpc(settings, rpc_chain):
        yield client, rpc_chain.url


def _rpc(settings, node):
    configure_rpc(settings, node)
    client = restart()
    snapshot = client.w3.testing.snapshot()  # the node lives for the session
    yield client
    client.w3.testing.revert(snapshot)
    ledger_chain.use_client(None)


def _paid_job(chain: ChainClient, make_user, make_agent, provider, deposit: int = 30):
    """A buyer deposits on chain and runs a one-round job on the provider's three nodes."""
    buyer_user, buyer_key = make_user("buyer")
    buyer = client_for(buyer_key)
    buyer_addr = chain.w3.eth.accounts[2]
    funding = register_wallet(buyer, buyer_addr)["funding_id"]
    register_wallet(provider, chain.w3.eth.accounts[3])
    chain.deposit(funding, deposit * UPC, sender=buyer_addr)
    assert ledger_chain.sync_deposits(chain) == 1
    earned = earn_from_a_paid_job(buyer, provider, make_agent)
    return buyer_user, buyer_key, funding, earned


def _sdk(key: str) -> Client:
    return Client(
        "http://testserver", key, transport=httpx.WSGITransport(app=get_wsgi_application())
    )


def _claim_proof(data: dict) -> ClaimProof:
    return ClaimProof(
        batch_id=bytes.fromhex(data["batch_id"][2:]),
        provider=data["provider"],
        token=data["token"],
        amount=int(data["amount"]),
        proof=tuple(bytes.fromhex(p[2:]) for p in data["proof"]),
    )


# -- provenance anchors --------------------------------------------------------------------


def test_completed_job_head_is_anchored_once_and_verify_checks_it_against_the_chain(
    rpc, make_user, make_agent, provider, tmp_path, monkeypatch
) -> None:
    chain, url = rpc
    _, buyer_key, _, _ = _paid_job(chain, make_user, make_agent, provider)
    anchor = ProvenanceAnchor.objects.get()  # sent on commit of the round that completed it
    assert anchor.head and anchor.anchored and anchor.round == 1 and anchor.tx_hash
    job_id = str(anchor.job_id)
    assert chain.verify_anchor(anchor.job_id, 1, bytes.fromhex(anchor.record_hash))

    # Sending again (a duplicate task, the periodic sweep, a restart) sends nothing.
    anchor.anchored = False
    anchor.save(update_fields=["anchored"])
    before = chain.next_nonce()
    assert anchoring.send_anchor(anchor.pk).anchored and chain.next_nonce() == before
    logs = chain.provenance.events.ProvenanceAnchored().get_logs(
        from_block=chain.deployment.from_block
    )
    assert len(logs) == 1

    with _sdk(buyer_key) as sdk:
        result = sdk.verify(job_id, url, tmp_path / "ok")
        assert result.ok, result.problems
        assert result.checks == {"model": True, "provenance": True, "anchor": True}
        assert result.details["anchor_tx"] == anchor.tx_hash
        model, record = (
            tmp_path / "ok" / f"{job_id}.safetensors",
            tmp_path / "ok" / (f"{job_id}.provenance.json"),
        )
        anchors = sdk.anchors(job_id)

        # A different model, a rewritten record, an anchor transaction that anchored
        # something else: each is caught, by the check it concerns.
        other = tmp_path / "other.safetensors"
        sdk_model = sdk.model_bytes(job_id)
        other.write_bytes(sdk_model.replace(sdk_model[-8:], b"\0" * 8))
        bad = verify_download(other, record, anchors, url)
        assert bad.checks["model"] is False and bad.checks["anchor"] is True
        rewritten = tmp_path / "rewritten.json"
        rewritten.write_text(record.read_text().replace('"accuracy": 0.', '"accuracy": 1.', 1))
        bad = verify_download(model, rewritten, anchors, url)
        assert bad.checks["provenance"] is False and bad.checks["anchor"] is False
        unrelated = _other_tx(chain)
        forged = anchors | {"anchors": [a | {"tx_hash": unrelated} for a in anchors["anchors"]]}
        assert verify_download(model, record, forged, url).checks["anchor"] is False

    monkeypatch.setattr(cli, "build_client", lambda args: _sdk(buyer_key))
    out = tmp_path / "cli"
    assert cli.main(["verify", job_id, "--chain-url", url, "-o", str(out), "--json"]) == 0


def _other_tx(chain: ChainClient) -> str:
    """A real transaction that anchored nothing (a deposit)."""
    receipt = chain.deposit("someone else's funding", 1, sender=chain.w3.eth.accounts[7])
    return "0x" + bytes(receipt["transactionHash"]).hex()


def test_an_anchor_lost_mid_send_is_finished_once_after_a_restart(
    chain, make_user, make_agent, provider
) -> None:
    _paid_job(chain, make_user, make_agent, provider)
    anchor = ProvenanceAnchor.objects.get()
    assert anchor.anchored
    job = anchor.job
    digest = "ab" * 32

    # Stored, its nonce stored, the process died before sending: the sweep sends it once.
    lost = ProvenanceAnchor.objects.create(job=job, round=7, record_hash=digest)
    lost.nonce = chain.next_nonce()
    lost.save(update_fields=["nonce"])
    assert anchoring.send_pending() == 1
    lost.refresh_from_db()
    assert lost.anchored and lost.tx_hash and lost.block_number

    # Sent and mined, the answer lost: the next look records it, sending nothing.
    mined = ProvenanceAnchor.objects.create(job=job, round=8, record_hash="cd" * 32)
    mined.nonce = chain.next_nonce()
    mined.save(update_fields=["nonce"])
    chain.anchor(job.pk, 8, bytes.fromhex("cd" * 32), nonce=mined.nonce)
    before = chain.next_nonce()
    assert anchoring.send_pending() == 1 and chain.next_nonce() == before
    mined.refresh_from_db()
    assert mined.anchored

    # Another hash already on chain for a round: refused, recorded, never overwritten.
    chain.anchor(job.pk, 9, bytes.fromhex("ee" * 32))
    clash = ProvenanceAnchor.objects.create(job=job, round=9, record_hash="ff" * 32)
    anchoring.send_anchor(clash.pk)
    clash.refresh_from_db()
    assert not clash.anchored and "on chain" in clash.failed
    assert chain.anchored(job.pk, 9).record_hash == bytes.fromhex("ee" * 32)


def test_rounds_are_anchored_when_the_spec_asks(chain, make_user, make_agent, provider) -> None:
    from tests.marketplace.test_ledger_jobs import work_all

    register_wallet(provider, chain.w3.eth.accounts[3])
    _, key = make_user("buyer")
    agents = [make_agent(kind="platform", price="600") for _ in range(3)]
    spec = {"name": "anchored", "dataset": {"kind": "digits"}, "local": {"steps": 2},
            "rounds": {"max_rounds": 2, "anchor_rounds": True},
            "sharding": {"method": "stratified", "num_shards": 3}}  # fmt: skip
    body = {"spec": spec, "tier": "platform", "budget": "500", "max_price_per_gpu_hour": "1000"}
    response = client_for(key).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    work_all(agents)
    anchors = list(ProvenanceAnchor.objects.order_by("round"))
    assert [(a.round, a.head, a.anchored) for a in anchors] == [(1, False, True), (2, True, True)]
    provenance = client_for(key).get(f"/api/v1/jobs/{anchors[0].job_id}/provenance").json()
    hashes = {r["round"]: r["record_hash"] for r in provenance["records"]}
    assert {a.round: a.record_hash for a in anchors} == hashes
    assert chain.verify_history(anchors[0].job_id, {r: bytes.fromhex(h) for r, h in hashes.items()})


# -- settlement batches and contribution roots ---------------------------------------------


def test_batches_close_on_the_deadline_or_the_count_and_anchor_contribution_roots(
    chain, make_user, make_agent, provider, settings
) -> None:
    settings.CHAIN = settings.CHAIN | {"DEADLINE_S": 30.0, "BATCH_MAX": 1000}
    _paid_job(chain, make_user, make_agent, provider)
    charges = Transaction.objects.filter(kind="charge").order_by("created_at")
    assert charges.count() == 3 and not charges.filter(settlement__isnull=False).exists()
    closed = charges.last().created_at  # the round closed: its work was charged

    # Not due before the deadline (the clock is the caller's: no sleeping).
    oldest = charges.first().created_at
    assert ledger_chain.settle(chain, now=oldest + timedelta(seconds=29.9)) is None
    record = ledger_chain.settle(chain, now=oldest + timedelta(seconds=30))
    assert record is not None and record.closed_reason == "deadline"
    assert record.anchored and record.posted and not record.batch_json  # no payout requested
    assert record.anchored_at is not None
    assert Transaction.objects.filter(settlement=record).count() == 3
    # latency from the round's close to an anchored, provable root: the deadline wait plus
    # the anchoring itself (reported by bench/settlement_bench.py, not asserted on timing)
    assert record.anchored_at >= closed

    anchored = chain.contributions_of(record.batch_id)
    assert anchored is not None and anchored.leaves == 3
    total_net = sum(Decimal(t.details["net"]) for t in charges)
    provider_api = provider
    proofs = []
    for node_id in sorted({t.node_id for t in charges}):
        body = provider_api.get(f"/api/v1/nodes/{node_id}/contributions").json()
        (proof,) = body["batches"]
        assert proof["anchored"] and proof["closed_reason"] == "deadline"
        assert check_contribution(proof)["ok"]
        assert chain.verify_contribution(ContributionProof.from_dict(proof))
        forged = ContributionProof.from_dict(proof | {"earnings": str(int(proof["earnings"]) + 1)})
        assert not chain.verify_contribution(forged)
        proofs.append(proof)
    assert sum(p["contributions"] for p in proofs) == 3
    assert sum(int(p["earnings"]) for p in proofs) == int(total_net * UPC)
    others = make_user("provider")[1]
    assert (
        client_for(others).get(f"/api/v1/nodes/{charges[0].node_id}/contributions").status_code
        == 404
    )

    # Nothing waits: no batch, however late.
    assert ledger_chain.settle(chain, now=oldest + timedelta(hours=1)) is None

    # The count closes a batch at once, before any deadline.
    settings.CHAIN = settings.CHAIN | {"BATCH_MAX": 2}
    Transaction.objects.filter(settlement=record).update(settlement=None)  # as if new work
    now = Transaction.objects.filter(kind="charge").first().created_at
    by_count = ledger_chain.settle(chain, now=now)
    assert by_count is not None and by_count.closed_reason == "count"
    assert Transaction.objects.filter(settlement=by_count).count() == 2
    assert ledger_chain.settle(chain, now=now) is None  # one left: waits for the deadline
    left = Transaction.objects.get(kind="charge", settlement__isnull=True).created_at
    assert ledger_chain.settle(chain, now=left + timedelta(seconds=29)) is None
    last = ledger_chain.settle(chain, now=left + timedelta(seconds=30))
    assert last is not None and last.closed_reason == "deadline"
    assert reconcile().ok, reconcile().problems


# -- withdrawals ---------------------------------------------------------------------------


def test_buyer_and_operator_withdraw_on_chain_and_the_ledger_reconciles(
    chain, make_user, make_agent, provider
) -> None:
    _, buyer_key, funding, _ = _paid_job(chain, make_user, make_agent, provider)
    buyer = client_for(buyer_key)
    charged = Decimal(30) - Decimal(buyer.get("/api/v1/ledger/withdrawals").json()["withdrawable"])
    assert charged > 0  # the job spent deposited money first
    most = Decimal(30) - charged

    too_much = buyer.post(
        "/api/v1/ledger/withdrawals", {"amount": str(most + 1), "idempotency_key": "w0"},
        format="json",
    )  # fmt: skip
    assert too_much.status_code == 400 and "unspent on-chain deposits" in too_much.json()["detail"]
    w = buyer.post("/api/v1/ledger/withdrawals", {"amount": str(most), "idempotency_key": "w1"},
                   format="json")  # fmt: skip
    assert w.status_code == 201, w.content
    again = buyer.post("/api/v1/ledger/withdrawals", {"amount": str(most), "idempotency_key": "w1"},
                       format="json")  # fmt: skip
    assert again.status_code == 200 and again.json()["id"] == w.json()["id"]
    assert Decimal(buyer.get("/api/v1/ledger/withdrawals").json()["withdrawable"]) == 0

    _, operator_key = make_user("operator")
    operator = client_for(operator_key)
    fees = Decimal(operator.get("/api/v1/operator/fees").json()["fees"])
    assert fees > 0
    treasury = chain.w3.eth.accounts[8]
    f = operator.post("/api/v1/operator/fees",
                      {"amount": str(fees), "wallet_address": treasury, "idempotency_key": "f1"},
                      format="json")  # fmt: skip
    assert f.status_code == 201, f.content
    assert balance(accounts.platform_fees()) == 0
    assert reconcile().ok, reconcile().problems

    record = ledger_chain.settle_payouts(chain)
    assert record is not None and record.posted and not record.failed
    assert chain.job(funding).settled == int((most + fees) * UPC)
    assert reconcile().ok, reconcile().problems

    # Pull, not push: each payee claims its own leaf with the proof the API serves.
    buyer_addr = chain.w3.eth.accounts[2]
    proof = _claim_proof(buyer.get(f"/api/v1/payouts/{w.json()['id']}/proof").json())
    before = chain.w3.eth.get_balance(buyer_addr)
    receipt_gas = chain.claim(proof, sender=chain.w3.eth.accounts[9])  # relayed: pays the buyer
    assert receipt_gas.amount == int(most * UPC)
    assert chain.w3.eth.get_balance(buyer_addr) - before == int(most * UPC)
    fee_proof = _claim_proof(operator.get(f"/api/v1/payouts/{f.json()['id']}/proof").json())
    assert chain.claim(fee_proof, sender=treasury).amount == int(fees * UPC)
    with pytest.raises(ChainError, match="AlreadyClaimed"):
        chain.claim(fee_proof, sender=treasury)
    # another user cannot read the buyer's proof
    assert operator.get(f"/api/v1/payouts/{w.json()['id']}/proof").status_code == 404
    assert Payout.objects.filter(status="batched").count() == 2
    assert reconcile().ok, reconcile().problems


def test_a_buyer_contract_that_refuses_native_currency_still_withdraws(
    chain, make_user, monkeypatch
) -> None:
    w3 = chain.w3
    funder = w3.eth.accounts[4]
    rejecting = chain.deploy_contract("RejectingBuyer", chain.escrow.address, sender=funder)
    _, buyer_key = make_user("buyer")
    buyer = client_for(buyer_key)
    funding = register_wallet(buyer, rejecting.address)["funding_id"]
    chain.transact(rejecting.functions.depositNative(funding), funder, value=5 * UPC)
    assert ledger_chain.sync_deposits(chain) == 1
    assert Decimal(buyer.get("/api/v1/ledger/withdrawals").json()["withdrawable"]) == 5

    # through the command line and the SDK, as a buyer would
    monkeypatch.setattr(cli, "build_client", lambda args: _sdk(buyer_key))
    assert cli.main(["withdraw", "5", "--key", "all"]) == 0
    (w,) = _sdk(buyer_key).withdrawals()["withdrawals"]
    assert (w["kind"], w["amount"], w["status"]) == ("withdrawal", "5.000000", "requested")
    record = ledger_chain.settle_payouts(chain)
    assert record is not None and record.posted
    assert cli.main(["proof", str(w["id"])]) == 0
    proof = _claim_proof(_sdk(buyer_key).payout_proof(w["id"]))
    assert proof.provider == rejecting.address

    # Its own claim fails (it refuses the coin); nothing else is blocked and the leaf waits.
    with pytest.raises(ChainError, match="NativeTransferFailed"):
        chain.transact(
            rejecting.functions.claim(proof.batch_id, proof.amount, list(proof.proof)), funder
        )
    assert not chain.is_claimed(proof)
    assert reconcile().ok, reconcile().problems
    # claimTo: the contract sends its own leaf to an address that takes it.
    before = w3.eth.get_balance(funder)
    receipt = chain.transact(
        rejecting.functions.claimTo(proof.batch_id, proof.amount, list(proof.proof), funder),
        w3.eth.accounts[5],
    )
    assert receipt["status"] == 1 and w3.eth.get_balance(funder) - before == 5 * UPC
    assert chain.is_claimed(proof) and chain.job(funding).settled == 5 * UPC
    assert reconcile().ok, reconcile().problems


# -- node registry -------------------------------------------------------------------------


def test_linking_a_wallet_registers_the_provider_and_its_capabilities_once(
    chain, make_agent, provider
) -> None:
    from marketplace.ledger import registry
    from marketplace.ledger.models import NodeRegistration

    address = chain.w3.eth.accounts[6]
    make_agent(kind="platform")
    register_wallet(provider, address)
    reg = NodeRegistration.objects.get()
    assert reg.registered and reg.address == address and reg.tx_hash
    info = chain.node(address)
    assert info.active and "0x" + info.capability_hash.hex() == reg.capability_hash
    assert reg.capability_hash == registry.capability_hash(reg.user)

    before = chain.next_nonce()
    register_wallet(provider, address)  # linked again, nothing changed: nothing sent
    assert NodeRegistration.objects.count() == 1 and chain.next_nonce() == before

    make_agent(kind="platform")  # another node: a new hash, an update on chain
    register_wallet(provider, address)
    assert NodeRegistration.objects.filter(registered=True).count() == 2
    assert "0x" + chain.node(address).capability_hash.hex() == registry.capability_hash(reg.user)

    chain.deactivate_node(address)  # the operator deactivated it: linking cannot revive it
    make_agent(kind="platform")
    register_wallet(provider, address)
    refused = NodeRegistration.objects.latest("pk")
    assert not refused.registered and "NodeInactive" in refused.failed
    assert not chain.node(address).active


# -- latency -------------------------------------------------------------------------------


def test_settlement_latency_from_a_rounds_close_to_a_claimable_proof(
    chain, make_user, make_agent, provider, settings, capsys
) -> None:
    """The round closes (its work is charged), the provider asks for its earnings at once, the
    beat's next look after the deadline closes the batch, and the payout proof and the
    contribution proof are then servable and check out on chain. The clock of the deadline is
    the test's (no sleeping); what the chain takes is measured and printed, never asserted."""
    import time

    settings.CHAIN = settings.CHAIN | {"DEADLINE_S": 30.0}
    _paid_job(chain, make_user, make_agent, provider)
    closed = Transaction.objects.filter(kind="charge").latest("created_at").created_at
    earned = provider.get("/api/v1/ledger/earnings").json()["balance"]
    request = {"amount": earned, "wallet_address": chain.w3.eth.accounts[3], "idempotency_key": "l"}
    payout = provider.post("/api/v1/payouts/", request, format="json").json()
    oldest = Transaction.objects.filter(kind="charge").earliest("created_at").created_at
    assert ledger_chain.settle(chain, now=oldest + timedelta(seconds=29)) is None

    started = time.perf_counter()
    record = ledger_chain.settle(chain, now=oldest + timedelta(seconds=30))
    proof = _claim_proof(provider.get(f"/api/v1/payouts/{payout['id']}/proof").json())
    node = Transaction.objects.filter(settlement=record).first().node_id
    leaf = provider.get(f"/api/v1/nodes/{node}/contributions").json()["batches"][0]
    send_s = time.perf_counter() - started
    assert record.posted and record.anchored and record.closed_reason == "deadline"
    assert chain.verify_contribution(ContributionProof.from_dict(leaf))
    assert chain.claim(proof, sender=chain.w3.eth.accounts[3]).amount == proof.amount

    wait_s = (oldest + timedelta(seconds=30) - closed).total_seconds()
    beat = settings.CELERY_BEAT_SCHEDULE.get("gpuflex-settle-chain", {}).get("schedule", 5)
    with capsys.disabled():
        print(
            f"\nsettlement latency ({settings.CHAIN['URL'][:9]}): round close -> batch due "
            f"{wait_s:.1f} s (deadline 30 s from the oldest contribution), + at most one "
            f"beat period ({beat} s), "
            f"+ close, post, anchor and serve both proofs {send_s:.2f} s; "
            f"post gas {record.gas_used}"
        )
