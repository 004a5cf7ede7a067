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
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from contracts import (
    ChainClient,
    ChainError,
    ContributionTree,
    Deployment,
    JobDebit,
    NodeContribution,
    SettlementBatch,
    to_bytes32,
)
from contracts import Payout as ChainPayout
from contracts.records import PostedBatch
from marketplace.accounts.models import User
from marketplace.ledger import accounts
from marketplace.ledger.chain_once import send_once
from marketplace.ledger.models import (
    ChainDeposit,
    Entry,
    Payout,
    PayoutKind,
    PayoutStatus,
    ProvenanceAnchor,
    SettlementRecord,
    Transaction,
    TxKind,
    WalletAddress,
)
from marketplace.ledger.money import from_units, q, to_units
from marketplace.ledger.posting import balance, post
from marketplace.ledger.sums import exact_sum, exact_sums_by
from marketplace.observability import metrics as obs

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
#
# A settlement batch closes when SETTLEMENT BATCH_MAX verified contributions (charges) wait, or
# when the oldest waiting contribution or payout request has waited DEADLINE_S, whichever comes
# first (`close_batch`, from the settle_chain beat task every few seconds). It covers two
# things, each sent exactly once (chain_once.send_once): the requested payouts the chain can
# fund, as a Merkle root of claims posted to the escrow, and the contributions, as a root of
# one (node, contributions, samples, earnings) leaf per node anchored in the ProvenanceRegistry.


def _money_records() -> QuerySet[SettlementRecord]:
    """Records whose payouts part exists and was not undone (posted or in flight)."""
    return SettlementRecord.objects.filter(failed="").exclude(batch_json="")


def _withdrawn_units() -> dict[str, int]:
    """Units each funding id has been debited for its buyer's own withdrawals."""
    upc = units_per_credit()
    out: dict[str, int] = {}
    for payout in Payout.objects.filter(
        kind=PayoutKind.WITHDRAWAL, status=PayoutStatus.BATCHED
    ).only("user_id", "amount"):
        key = funding_id(payout.user_id)
        out[key] = out.get(key, 0) + to_units(payout.amount, upc)
    return out


def _debited_units() -> dict[str, int]:
    """Units each funding id has been debited by batches not undone (posted or in flight)."""
    out: dict[str, int] = {}
    for record in _money_records():
        for job, amount in SettlementBatch.from_json(record.batch_json).debits:
            key = "0x" + job.hex()
            out[key] = out.get(key, 0) + amount
    return out


def _funding() -> list[tuple[str, int, int, int]]:
    """Per funding id with credited deposits: (id, deposited, charged, withdrawn) in units."""
    upc = units_per_credit()
    credited = ChainDeposit.objects.filter(transaction__isnull=False)
    owners = dict(credited.values_list("funding_id", "user_id").distinct())
    withdrawn = _withdrawn_units()
    out = []
    for fid, units in sorted(exact_sums_by(credited, "funding_id", "units").items()):
        charges = Entry.objects.filter(
            transaction__kind=TxKind.CHARGE, account__job__buyer_id=owners[fid]
        )
        # forfeited work's refunds (ledger/holds.py) were never spent: back in the buyer's credit
        refunded = Entry.objects.filter(
            transaction__kind=TxKind.FORFEIT, account__code=f"buyer:{owners[fid]}"
        )
        charged = to_units(q(-exact_sum(charges) - exact_sum(refunded)), upc)
        out.append((str(fid), int(units), charged, withdrawn.get(str(fid), 0)))
    return out


def _debitable_units(withdrawing: dict[str, int] | None = None) -> list[tuple[str, int]]:
    """Per funding id, deposited money the ledger has charged for work and not yet debited:
    a buyer's deposits are taken to be spent before any granted credit, and what the buyer
    withdrew, or is withdrawing in the batch being built (`withdrawing`), is no longer theirs
    to spend. Work debits never exceed deposits less withdrawals, so work and withdrawals
    together never exceed the deposits."""
    debited = _debited_units()
    out = []
    for fid, deposited, charged, withdrawn in _funding():
        spendable = min(deposited - withdrawn - (withdrawing or {}).get(fid, 0), charged)
        left = spendable - (debited.get(fid, 0) - withdrawn)
        if left > 0:
            out.append((fid, left))
    return out


def withdrawable(user: User) -> Decimal:
    """What a buyer may withdraw to its wallet: unspent on-chain deposits (deposited, less
    charged, less withdrawn or requested), and never more than its spendable credit."""
    fid = funding_id(user)
    upc = units_per_credit()
    requested = exact_sum(
        Payout.objects.filter(user=user, kind=PayoutKind.WITHDRAWAL, status=PayoutStatus.REQUESTED)
    )
    for key, deposited, charged, withdrawn in _funding():
        if key == fid:
            unspent = from_units(max(deposited - charged - withdrawn, 0), upc) - q(requested)
            return max(min(unspent, balance(accounts.buyer_credit(user))), Decimal(0))
    return Decimal(0)


def _due(now: datetime, force: bool) -> tuple[str, list[int]]:
    """Why a batch closes now ("" for not yet) and the charges it covers, oldest first."""
    limit = int(settings.CHAIN["BATCH_MAX"])
    waiting = Transaction.objects.filter(
        kind=TxKind.CHARGE, settlement__isnull=True, node__isnull=False
    ).order_by("created_at", "pk")
    charges = list(waiting.values_list("pk", flat=True)[:limit])
    last = SettlementRecord.objects.aggregate(t=Max("created_at"))["t"]
    # payouts an earlier batch could not fund do not close batches again and again
    fresh = Payout.objects.filter(status=PayoutStatus.REQUESTED)
    if last is not None:
        fresh = fresh.filter(created_at__gt=last)
    oldest = [
        t
        for t in (
            waiting.values_list("created_at", flat=True).first(),
            fresh.order_by("created_at").values_list("created_at", flat=True).first(),
        )
        if t is not None
    ]
    if force:
        return "manual", charges
    if len(charges) >= limit:
        return "count", charges
    deadline = timedelta(seconds=float(settings.CHAIN["DEADLINE_S"]))
    if oldest and now - min(oldest) >= deadline:
        return "deadline", charges
    return "", []


def _contributions(batch_id: uuid.UUID, charge_ids: list[int]) -> ContributionTree | None:
    if not charge_ids:
        return None
    upc = units_per_credit()
    rows: dict[int, NodeContribution] = {}  # node id (its bytes32 on chain) -> totals
    charges = Transaction.objects.filter(pk__in=charge_ids).select_related("task_result")
    for tx in charges:
        node = int(tx.node_id)
        earned = to_units(Decimal(str(tx.details.get("net", "0"))), upc)
        samples = tx.task_result.num_samples if tx.task_result else 0
        row = rows.get(node)
        rows[node] = NodeContribution(
            node,
            (row.contributions if row else 0) + 1,
            (row.samples if row else 0) + samples,
            (row.earnings if row else 0) + earned,
        )
    return ContributionTree.build(batch_id, rows.values())


def close_batch(now: datetime | None = None, force: bool = False) -> SettlementRecord | None:
    """Close a settlement batch when one is due (or `force`): store its payouts part (requested
    payouts, oldest first, as far as charged deposits cover them) and its contributions part,
    to be sent once this commits. Returns None when nothing is due or there is nothing to
    settle."""
    now = now or timezone.now()
    upc = units_per_credit()
    with transaction.atomic():
        reason, charge_ids = _due(now, force)
        if not reason:
            return None
        charge_ids = list(
            Transaction.objects.select_for_update(skip_locked=True)
            .filter(pk__in=charge_ids, settlement__isnull=True)
            .values_list("pk", flat=True)
        )
        requested = list(
            Payout.objects.select_for_update(no_key=True)
            .filter(status=PayoutStatus.REQUESTED)
            .order_by("created_at", "pk")
        )
        # withdrawals come from the buyer's own funding id, out of money nothing has been
        # charged for (checked when requested); the work pool is what is left beside them
        chosen = [p for p in requested if p.kind == PayoutKind.WITHDRAWAL]
        withdrawals: dict[str, int] = {}  # funding id -> units its buyer withdraws
        for payout in chosen:
            key = funding_id(payout.user_id)
            withdrawals[key] = withdrawals.get(key, 0) + to_units(payout.amount, upc)
        available = _debitable_units(withdrawals)
        budget = sum(units for _, units in available)
        for payout in requested:
            units = to_units(payout.amount, upc)
            if payout.kind != PayoutKind.WITHDRAWAL and units <= budget:
                chosen.append(payout)
                budget -= units
        if not chosen and not charge_ids:
            return None
        batch_id = uuid.uuid4()
        batch_json = ""
        if chosen:
            need = sum(to_units(p.amount, upc) for p in chosen if p.kind != PayoutKind.WITHDRAWAL)
            debits = [JobDebit(fid, units) for fid, units in withdrawals.items()]
            for fid, units in available:
                take = min(units, need)
                if take:
                    debits.append(JobDebit(fid, take))
                    need -= take
            batch_json = SettlementBatch.build(
                batch_id,
                [ChainPayout(p.wallet_address, to_units(p.amount, upc)) for p in chosen],
                debits,
                token=token(),
            ).to_json()
        tree = _contributions(batch_id, charge_ids)
        record = SettlementRecord.objects.create(
            batch_id="0x" + to_bytes32(batch_id).hex(),
            batch_json=batch_json,
            total_units=sum(to_units(p.amount, upc) for p in chosen),
            posted=not chosen,
            contributions_json=tree.to_json() if tree else "",
            anchored=tree is None,
            closed_reason=reason,
        )
        Transaction.objects.filter(pk__in=charge_ids).update(settlement=record)
        obs.settlement_batch(reason)
        if chosen:
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
    return record


def settle(
    client: ChainClient, now: datetime | None = None, force: bool = False
) -> SettlementRecord | None:
    """Finish every stored batch and anchor not yet on chain, then close and send a batch if
    one is due (`force`: close one now, whatever the deadline)."""
    for pending in SettlementRecord.objects.filter(failed="").filter(
        Q(posted=False) | Q(anchored=False)
    ):
        send_record(client, pending)
    record = close_batch(now, force)
    if record is not None:
        send_record(client, record)
        record.refresh_from_db()
    return record


def settle_payouts(client: ChainClient) -> SettlementRecord | None:
    """Close a batch now, whatever the deadline (`gpuflex manage settle_chain`, tests)."""
    return settle(client, force=True)


def send_record(client: ChainClient, record: SettlementRecord) -> None:
    """Post the batch's payouts, then, once they are on chain, anchor its contribution root:
    each exactly once. (A batch the chain refuses gives its contributions to the next one.)"""
    if not record.posted and not record.failed:
        _post(client, record)
    if record.posted and not record.anchored and not record.failed:
        if not record.contributions_json:  # a batch stored before contribution roots existed
            record.anchored = True
            record.save(update_fields=["anchored"])
            return
        _anchor_contributions(client, record)


def _anchor_contributions(client: ChainClient, record: SettlementRecord) -> None:
    tree = ContributionTree.from_json(record.contributions_json)

    def landed() -> bool:
        onchain = client.contributions_of(tree.batch_id)
        if onchain is not None and onchain.root != tree.root:
            raise ChainError("ContributionsAlreadyAnchored", (), "another root is on chain")
        return onchain is not None

    try:
        sent = send_once(
            client,
            record,
            "anchor_nonce",
            landed,
            lambda n: client.anchor_contributions(tree.batch_id, tree.root, len(tree.nodes), n),
        )
    except ChainError as exc:
        log.error("contribution root of batch %s not anchored: %s", record.batch_id, exc)
        return  # the next run looks again; a revert here leaves the money part unaffected
    if sent == "pending":
        return
    record.anchored, record.anchored_at = True, timezone.now()
    if not isinstance(sent, str):
        record.anchor_tx_hash = "0x" + bytes(sent["transactionHash"]).hex()
    record.save(update_fields=["anchored", "anchored_at", "anchor_tx_hash"])


def _post(client: ChainClient, record: SettlementRecord) -> None:
    """Get a stored batch's payouts on chain exactly once (chain_once.send_once). A revert
    puts its payouts back to pending; `BatchExists` means it landed after all."""
    batch = SettlementBatch.from_json(record.batch_json)
    try:
        sent = send_once(
            client,
            record,
            "nonce",
            lambda: client.batch_state(batch.batch_id) is not None,
            lambda n: client.post_batch(batch, nonce=n),
        )
    except ChainError as exc:
        if exc.name == "BatchExists":  # it landed after all: the next run records it
            return
        _undo(record, str(exc))
        return
    if sent == "pending":
        log.info("settlement batch %s is pending on chain", record.batch_id)
        return
    _mark_posted(record, client.batch_posted(batch.batch_id) if sent == "landed" else sent)


def _mark_posted(record: SettlementRecord, posted: PostedBatch | None) -> None:
    record.posted, record.posted_at = True, timezone.now()
    if posted is not None:
        record.gas_used = posted.gas_used
        record.tx_hash = "0x" + posted.ref.tx_hash.hex()
    record.save(update_fields=["posted", "posted_at", "gas_used", "tx_hash"])


@transaction.atomic
def _undo(record: SettlementRecord, reason: str) -> None:
    """The chain refused the batch: its payouts are pending again, nothing left the ledger.
    Its contributions wait for the next batch unless their root is already anchored."""
    payouts = list(Payout.objects.select_for_update(no_key=True).filter(batch=record))
    total = q(sum((p.amount for p in payouts), Decimal(0)))
    post(
        f"settle-undo:{record.batch_id}",
        TxKind.PAYOUT_REVERSED,
        [(accounts.external_chain(), -total), (accounts.payouts_pending(), total)],
        memo=f"batch {record.batch_id} refused by the chain",
        details={"batch": record.batch_id, "reason": reason[:200]},
    )
    Payout.objects.filter(batch=record).update(status=PayoutStatus.REQUESTED, batch=None)
    if not record.anchored:
        Transaction.objects.filter(settlement=record).update(settlement=None)
        record.contributions_json, record.anchored = "", True
    record.failed = reason[:300]
    record.save(update_fields=["failed", "contributions_json", "anchored"])
    log.error("settlement batch %s failed: %s", record.batch_id, reason)


def claim_proof(payout: Payout) -> dict[str, object]:
    """What the payee sends to the contract's claim() for the batch holding `payout`."""
    if payout.status != PayoutStatus.BATCHED or payout.batch is None:
        raise ValueError(f"payout {payout.pk} is {payout.status}, not in a settlement batch")
    batch = SettlementBatch.from_json(payout.batch.batch_json)
    return batch.proof_for(payout.wallet_address).to_dict() | {
        "posted": payout.batch.posted,
        "tx_hash": payout.batch.tx_hash,
        "escrow": client_deployment("escrow"),
    }


def contribution_proof(record: SettlementRecord, node_id: int) -> dict[str, object]:
    """A node's leaf in the batch's contribution tree, its proof, and where the root is
    anchored: what `ContributionProof.from_dict(...)` and the chain check."""
    if not record.contributions_json:
        raise ValueError(f"batch {record.batch_id} covers no contributions")
    tree = ContributionTree.from_json(record.contributions_json)
    return tree.proof_for(node_id).to_dict() | {
        "anchored": record.anchored,
        "anchor_tx_hash": record.anchor_tx_hash,
        "provenance_registry": client_deployment("provenance"),
    }


def client_deployment(name: str) -> str:
    client = chain_client()
    return getattr(client.deployment, name) if client is not None else ""


# -- reconciliation ---------------------------------------------------------------------------


def _anchor_problems(client: ChainClient) -> list[str]:
    """Every anchored contribution root and provenance record is on chain as recorded, and
    the buyers' withdrawals never exceed their deposits."""
    problems = []
    for record in SettlementRecord.objects.filter(anchored=True).exclude(contributions_json=""):
        tree = ContributionTree.from_json(record.contributions_json)
        onchain = client.contributions_of(tree.batch_id)
        if onchain is None or onchain.root != tree.root:
            problems.append(
                f"Batch {record.batch_id}'s contribution root is not on chain as stored."
            )
    for anchor in ProvenanceAnchor.objects.filter(anchored=True):
        if not client.verify_anchor(anchor.job_id, anchor.round, bytes.fromhex(anchor.record_hash)):
            problems.append(f"Job {anchor.job_id} round {anchor.round}'s anchor is not on chain.")
    failed = ProvenanceAnchor.objects.exclude(failed="").values_list("job_id", "round", "failed")
    problems += [f"Job {j} round {r} could not be anchored: {why}" for j, r, why in failed]
    # work debits never exceed deposits less withdrawals (_debitable_units), so withdrawals
    # can never exceed the deposits (charges may later exceed them, paid from granted credit)
    for fid, deposited, _, withdrawn in _funding():
        if withdrawn > deposited:
            problems.append(
                f"Funding {fid}: withdrawals of {withdrawn} exceed the deposits of {deposited}."
            )
    return problems


def reconcile_chain(client: ChainClient) -> list[str]:
    problems = []
    deposited: dict[str, int] = {}
    for fid, units in exact_sums_by(ChainDeposit.objects.all(), "funding_id", "units").items():
        deposited[str(fid)] = int(units)
    debited: dict[str, int] = {}
    for record in _money_records().filter(posted=True):
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
    problems += _anchor_problems(client)
    pending = _money_records().filter(posted=False).values_list("batch_id", flat=True)
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
