"""The ledger and the escrow contract: deposits in, settlement batches out, reconciliation.

The contract keeps escrow per bytes32 id. GPUFlex gives each buyer one funding id (see
`funding_id`) to deposit into from their registered wallet; the ledger credits each Deposited
event once. Requested payouts are settled in Merkle batches whose debits come from funding ids
whose money the ledger has already charged for verified work, so a buyer's unspent deposit is
never used to pay anyone. Import only with the chain enabled (web3 is an optional extra).
"""

from __future__ import annotations

import logging
import uuid
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from contracts import ChainClient, ChainError, Deployment, JobDebit, SettlementBatch, to_bytes32
from contracts import Payout as ChainPayout
from contracts.records import PostedBatch
from marketplace.accounts.models import User
from marketplace.ledger import accounts
from marketplace.ledger.models import (
    ChainDeposit,
    Entry,
    Payout,
    PayoutStatus,
    SettlementRecord,
    TxKind,
    WalletAddress,
)
from marketplace.ledger.money import from_units, q, to_units
from marketplace.ledger.posting import balance, post
from marketplace.ledger.sums import exact_sum, exact_sums_by

log = logging.getLogger(__name__)
_client: ChainClient | None = None


def chain_client() -> ChainClient | None:
    """The configured chain, or None when it is disabled; one client per process."""
    global _client
    url = settings.CHAIN["URL"]
    if not url:
        return None
    if _client is None:
        if url == "embedded":
            _client = ChainClient.embedded()
        else:
            deployment = Deployment.from_json(settings.CHAIN["DEPLOYMENT"])
            _client = ChainClient.from_url(url, deployment, settings.CHAIN["OPERATOR_KEY"])
    return _client


def use_client(client: ChainClient | None) -> None:
    """Tests and the demo hand in the chain they made."""
    global _client
    _client = client


def units_per_credit() -> int:
    return int(settings.CHAIN["UNITS_PER_CREDIT"])


def token() -> str:
    return str(settings.CHAIN["TOKEN"])


def funding_id(user: User | int) -> str:
    uid = user if isinstance(user, int) else user.pk
    return "0x" + to_bytes32(f"gpuflex-buyer:{uid}").hex()


# -- deposits ---------------------------------------------------------------------------------


def sync_deposits(client: ChainClient) -> int:
    """Credit new Deposited events; returns how many were credited. Deposits nobody can be
    matched to (an unknown wallet, a foreign id or token) are kept for an operator."""
    last = ChainDeposit.objects.aggregate(b=Max("block_number"))["b"]
    start = client.deployment.from_block if last is None else last  # re-reading is harmless
    credited = 0
    for d in client.deposits(from_block=start):
        if ChainDeposit.objects.filter(event_key=d.ref.key).exists():
            continue
        wallet = (
            WalletAddress.objects.filter(address__iexact=d.buyer).select_related("user").first()
        )
        fid = "0x" + d.job_id.hex()
        user = wallet.user if wallet and funding_id(wallet.user) == fid else None
        if d.token.lower() != token().lower():
            user = None
        amount = from_units(d.amount, units_per_credit())
        with transaction.atomic():
            record = ChainDeposit.objects.create(
                event_key=d.ref.key,
                funding_id=fid,
                buyer_address=d.buyer,
                token=d.token,
                units=d.amount,
                amount=amount,
                user=user,
                block_number=d.ref.block_number,
            )
            if user is not None and amount > 0:
                record.transaction = post(
                    f"deposit:{d.ref.key}",
                    TxKind.DEPOSIT,
                    [(accounts.external_chain(), -amount), (accounts.buyer_credit(user), amount)],
                    memo=f"on-chain deposit from {d.buyer}",
                    details={"event": d.ref.key, "units": str(d.amount)},
                )
                record.save(update_fields=["transaction"])
                credited += 1
            else:
                log.warning("deposit %s from %s matches no buyer; kept", d.ref.key, d.buyer)
    return credited


# -- settlement -------------------------------------------------------------------------------


def _debited_units() -> dict[str, int]:
    """Units each funding id has been debited by batches not undone (posted or in flight)."""
    out: dict[str, int] = {}
    for record in SettlementRecord.objects.filter(failed=""):
        for job, amount in SettlementBatch.from_json(record.batch_json).debits:
            key = "0x" + job.hex()
            out[key] = out.get(key, 0) + amount
    return out


def _debitable_units() -> list[tuple[str, int]]:
    """Per funding id, deposited money the ledger has charged for work and not yet debited:
    a buyer's deposits are taken to be spent before any granted credit."""
    upc = units_per_credit()
    debited = _debited_units()
    out = []
    credited = ChainDeposit.objects.filter(transaction__isnull=False)
    owners = dict(credited.values_list("funding_id", "user_id").distinct())
    for fid, units in sorted(exact_sums_by(credited, "funding_id", "units").items()):
        charges = Entry.objects.filter(
            transaction__kind=TxKind.CHARGE, account__job__buyer_id=owners[fid]
        )
        spent = -exact_sum(charges)
        spendable = min(int(units), to_units(q(spent), upc))
        left = spendable - debited.get(str(fid), 0)
        if left > 0:
            out.append((str(fid), left))
    return out


def settle_payouts(client: ChainClient) -> SettlementRecord | None:
    """Post one batch paying requested payouts, oldest first, as far as charged deposits
    cover them; retries a batch an earlier run stored but did not get on chain."""
    for record in SettlementRecord.objects.filter(posted=False, failed=""):
        _post(client, record)
    upc = units_per_credit()
    with transaction.atomic():
        available = _debitable_units()
        budget = sum(units for _, units in available)
        chosen: list[Payout] = []
        for payout in (
            Payout.objects.select_for_update()
            .filter(status=PayoutStatus.REQUESTED)
            .order_by("created_at", "pk")
        ):
            units = to_units(payout.amount, upc)
            if units <= budget:
                chosen.append(payout)
                budget -= units
        if not chosen:
            return None
        need = sum(to_units(p.amount, upc) for p in chosen)
        debits = []
        for fid, units in available:
            take = min(units, need)
            if take:
                debits.append(JobDebit(fid, take))
                need -= take
        batch_id = uuid.uuid4()
        batch = SettlementBatch.build(
            batch_id,
            [ChainPayout(p.wallet_address, to_units(p.amount, upc)) for p in chosen],
            debits,
            token=token(),
        )
        record = SettlementRecord.objects.create(
            batch_id="0x" + batch.batch_id.hex(),
            batch_json=batch.to_json(),
            total_units=batch.total,
        )
        total = q(sum((p.amount for p in chosen), Decimal(0)))
        post(
            f"settle:{record.batch_id}",
            TxKind.PAYOUT_SETTLED,
            [(accounts.payouts_pending(), -total), (accounts.external_chain(), total)],
            memo=f"settlement batch {record.batch_id} ({len(chosen)} payouts)",
            details={"batch": record.batch_id, "payouts": [p.pk for p in chosen]},
        )
        Payout.objects.filter(pk__in=[p.pk for p in chosen]).update(
            status=PayoutStatus.BATCHED, batch=record
        )
    _post(client, record)
    return record


def _post(client: ChainClient, record: SettlementRecord) -> None:
    """Get a stored batch on chain exactly once.

    The operator nonce is stored before the transaction is sent, so a run that lost the answer
    (a dropped connection, a crash) can tell after a restart what became of it: on chain (done),
    still pending (leave it: the next run looks again), or never arrived (send it again with the
    same nonce, so at most one of the two can run). Posting afresh while the first transaction
    could still be mined was how a lost receipt paid twice: the second post reverted with
    BatchExists, the payouts went back to pending and a new batch paid them again.
    """
    batch = SettlementBatch.from_json(record.batch_json)
    if client.batch_state(batch.batch_id) is not None:
        _mark_posted(record, client.batch_posted(batch.batch_id))
        return
    if record.nonce is not None:
        sent = client.nonce_state(int(record.nonce))
        if sent == "pending":
            log.info("settlement batch %s is pending on chain", record.batch_id)
            return
        if sent == "mined":
            # The nonce is spent and the batch is not on chain: that transaction reverted (or
            # never carried the batch) and can never land now, so posting afresh is safe.
            record.nonce = None
    if record.nonce is None:
        record.nonce = client.next_nonce()
        record.save(update_fields=["nonce"])
    try:
        posted = client.post_batch(batch, nonce=int(record.nonce))
    except ChainError as exc:
        if exc.name == "BatchExists":  # it landed after all: the next run records it
            return
        _undo(record, str(exc))
        return
    _mark_posted(record, posted)


def _mark_posted(record: SettlementRecord, posted: PostedBatch | None) -> None:
    record.posted = True
    if posted is not None:
        record.gas_used = posted.gas_used
        record.tx_hash = "0x" + posted.ref.tx_hash.hex()
    record.save(update_fields=["posted", "gas_used", "tx_hash"])


@transaction.atomic
def _undo(record: SettlementRecord, reason: str) -> None:
    """The chain refused the batch: its payouts are pending again, nothing left the ledger."""
    payouts = list(Payout.objects.select_for_update().filter(batch=record))
    total = q(sum((p.amount for p in payouts), Decimal(0)))
    post(
        f"settle-undo:{record.batch_id}",
        TxKind.PAYOUT_REVERSED,
        [(accounts.external_chain(), -total), (accounts.payouts_pending(), total)],
        memo=f"batch {record.batch_id} refused by the chain",
        details={"batch": record.batch_id, "reason": reason[:200]},
    )
    Payout.objects.filter(batch=record).update(status=PayoutStatus.REQUESTED, batch=None)
    record.failed = reason[:300]
    record.save(update_fields=["failed"])
    log.error("settlement batch %s failed: %s", record.batch_id, reason)


def claim_proof(payout: Payout) -> dict[str, object]:
    """What the provider sends to the contract's claim() for the batch holding `payout`."""
    if payout.status != PayoutStatus.BATCHED or payout.batch is None:
        raise ValueError(f"payout {payout.pk} is {payout.status}, not in a settlement batch")
    batch = SettlementBatch.from_json(payout.batch.batch_json)
    return batch.proof_for(payout.wallet_address).to_dict()


# -- reconciliation ---------------------------------------------------------------------------


def reconcile_chain(client: ChainClient) -> list[str]:
    problems = []
    deposited: dict[str, int] = {}
    for fid, units in exact_sums_by(ChainDeposit.objects.all(), "funding_id", "units").items():
        deposited[str(fid)] = int(units)
    debited: dict[str, int] = {}
    for record in SettlementRecord.objects.filter(posted=True, failed=""):
        batch = SettlementBatch.from_json(record.batch_json)
        for job, amount in batch.debits:
            key = "0x" + job.hex()
            debited[key] = debited.get(key, 0) + amount
        state = client.batch_state(batch.batch_id)
        if state is None:
            problems.append(
                f"Batch {record.batch_id} is recorded as posted but the chain lacks it."
            )
        elif state.total != int(record.total_units) or state.root != batch.root:
            problems.append(f"Batch {record.batch_id} differs on chain (total {state.total}).")
    for fid in sorted(set(deposited) | set(debited)):
        escrow = client.job(fid)
        if escrow.deposited != deposited.get(fid, 0):
            problems.append(
                f"Funding {fid}: the chain holds deposits of {escrow.deposited}, "
                f"the ledger recorded {deposited.get(fid, 0)}."
            )
        if escrow.settled != debited.get(fid, 0):
            problems.append(
                f"Funding {fid}: the chain debited {escrow.settled}, "
                f"the ledger {debited.get(fid, 0)}."
            )
    pending = SettlementRecord.objects.filter(posted=False, failed="").values_list(
        "batch_id", flat=True
    )
    problems += [f"Batch {b} is stored but not on chain yet: run settle_payouts." for b in pending]
    credited = exact_sum(ChainDeposit.objects.filter(transaction__isnull=False))
    batched = exact_sum(Payout.objects.filter(status=PayoutStatus.BATCHED))
    expected = q(batched) - q(credited)
    world = balance(accounts.external_chain())
    if world != expected:
        problems.append(
            f"The chain account is at {world}; "
            f"batched payouts less credited deposits is {expected}."
        )
    return problems
