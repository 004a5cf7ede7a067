"""The double-entry ledger: accounts, transactions whose entries sum to zero, payouts, and
what the chain glue has seen (deposit events, settlement batches).

Balances are never stored: an account's balance is the sum of its entries. Amounts are
fixed-point credits (see money.py), never floats.
"""

# ruff: noqa: RUF012 - Django declares Meta options as class attributes

from __future__ import annotations

from django.conf import settings
from django.db import models

from marketplace.ledger.money import DECIMAL_PLACES, MAX_DIGITS


class AccountKind(models.TextChoices):
    BUYER_CREDIT = "buyer_credit"  # a buyer's spendable credit
    JOB_ESCROW = "job_escrow"  # a job's budget, held while it runs
    PROVIDER_EARNINGS = "provider_earnings"  # earned, not yet requested as a payout
    PAYOUTS_PENDING = "payouts_pending"  # requested payouts on their way out
    PLATFORM_FEES = "platform_fees"
    # Outside the platform: money enters from them and leaves to them, so they go negative.
    EXTERNAL_GRANTS = "external_grants"
    EXTERNAL_CHAIN = "external_chain"
    EXTERNAL_PAYOUTS = "external_payouts"


# Accounts that hold the platform's users' money: never below zero.
NON_NEGATIVE = {
    AccountKind.BUYER_CREDIT,
    AccountKind.JOB_ESCROW,
    AccountKind.PROVIDER_EARNINGS,
    AccountKind.PAYOUTS_PENDING,
    AccountKind.PLATFORM_FEES,
}


class Account(models.Model):
    code = models.CharField(max_length=80, unique=True)
    kind = models.CharField(max_length=24, choices=AccountKind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_accounts",
    )
    job = models.OneToOneField(
        "jobs.Job", null=True, blank=True, on_delete=models.PROTECT, related_name="escrow_account"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.code

    @property
    def non_negative(self) -> bool:
        return self.kind in NON_NEGATIVE


class TxKind(models.TextChoices):
    GRANT = "grant"  # operator adds credit
    DEPOSIT = "deposit"  # on-chain deposit credited
    HOLD = "hold"  # a job's budget moves into escrow
    CHARGE = "charge"  # verified work paid from escrow to the provider and the platform
    RELEASE = "release"  # unspent escrow back to the buyer
    PAYOUT_REQUEST = "payout_request"
    PAYOUT_SETTLED = "payout_settled"
    PAYOUT_REVERSED = "payout_reversed"
    # a node failed verification: its held earnings go back to the buyers (ledger/holds.py)
    FORFEIT = "forfeit"


class Transaction(models.Model):
    """One movement of money; `key` makes posting it idempotent (a retry finds it)."""

    key = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=20, choices=TxKind.choices)
    memo = models.CharField(max_length=300, blank=True)
    # what it is about, for selectors and audits
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.PROTECT, related_name="ledger_txs"
    )
    node = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.PROTECT, related_name="ledger_txs"
    )
    # a result is charged at most once, enforced by the database as well as by `key`
    task_result = models.OneToOneField(
        "rounds.TaskResult", null=True, blank=True, on_delete=models.PROTECT, related_name="charge"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_actions",
    )
    details = models.JSONField(default=dict, blank=True)
    # a charge (a verified contribution): the settlement batch whose contribution root covers
    # it, None while it waits for the next batch to close (ledger/chain.py)
    settlement = models.ForeignKey(
        "ledger.SettlementRecord",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="contributions",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class Entry(models.Model):
    """A signed amount on one account: positive raises its balance, negative lowers it."""

    transaction = models.ForeignKey(Transaction, on_delete=models.PROTECT, related_name="entries")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    amount = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)

    class Meta:
        indexes = [models.Index(fields=["account", "transaction"])]


class PayoutStatus(models.TextChoices):
    REQUESTED = "requested"  # held in payouts_pending
    BATCHED = "batched"  # in an on-chain settlement batch: claimable with a proof
    PAID = "paid"  # paid off-chain by an operator (with a reference)
    REVERSED = "reversed"  # failed; the money went back to the provider's earnings


class PayoutKind(models.TextChoices):
    EARNINGS = "earnings"  # a provider's earnings
    WITHDRAWAL = "withdrawal"  # a buyer's unspent on-chain deposit, back to its wallet
    FEES = "fees"  # platform fees, to the operator's wallet


class Payout(models.Model):
    """Money leaving the ledger to a wallet: paid off-chain, or a leaf of a settlement batch
    that its owner pulls from the escrow with a proof (never pushed)."""

    kind = models.CharField(max_length=12, choices=PayoutKind.choices, default=PayoutKind.EARNINGS)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="payouts"
    )
    amount = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    wallet_address = models.CharField(max_length=42)
    # the client's idempotency key: a retried request finds the first payout
    request_key = models.CharField(max_length=100)
    status = models.CharField(
        max_length=16, choices=PayoutStatus.choices, default=PayoutStatus.REQUESTED
    )
    batch = models.ForeignKey(
        "ledger.SettlementRecord",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payouts",
    )
    reference = models.CharField(max_length=200, blank=True, help_text="external payment id")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "request_key"], name="payout_unique_request")
        ]
        indexes = [models.Index(fields=["status", "created_at"])]


class ChainDeposit(models.Model):
    """A Deposited event, recorded once by its (tx hash, log index) key."""

    event_key = models.CharField(max_length=140, unique=True)
    funding_id = models.CharField(max_length=66, help_text="0x-hex bytes32 the buyer paid into")
    buyer_address = models.CharField(max_length=42)
    token = models.CharField(max_length=42)
    units = models.DecimalField(max_digits=78, decimal_places=0)
    amount = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    # None while no GPUFlex account matches the depositor: kept, never lost, for an operator
    transaction = models.OneToOneField(
        Transaction, null=True, blank=True, on_delete=models.PROTECT, related_name="deposit"
    )
    block_number = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class SettlementRecord(models.Model):
    """An on-chain settlement batch: stored before posting, so proofs can be served later.

    Two parts, each sent exactly once: the payouts (a Merkle root of claims, posted to the
    escrow; empty when the batch paid nobody, then `posted` from the start) and the
    contributions it covers (a root of one leaf per node, anchored in the ProvenanceRegistry;
    empty when no work was verified since the last batch, then `anchored` from the start)."""

    batch_id = models.CharField(max_length=66, unique=True)
    batch_json = models.TextField(blank=True)
    total_units = models.DecimalField(max_digits=78, decimal_places=0)
    posted = models.BooleanField(default=False)
    # a revert: the batch's payouts went back to pending and this record is history
    failed = models.CharField(max_length=300, blank=True)
    gas_used = models.PositiveBigIntegerField(null=True, blank=True)
    # the operator nonce of the posting transaction, stored before it is sent: after a lost
    # answer it tells whether that transaction was mined, is pending or never arrived
    nonce = models.PositiveBigIntegerField(null=True, blank=True)
    tx_hash = models.CharField(max_length=66, blank=True)  # of the transaction that posted it
    contributions_json = models.TextField(blank=True)
    anchored = models.BooleanField(default=False)
    anchor_nonce = models.PositiveBigIntegerField(null=True, blank=True)  # as `nonce`
    anchor_tx_hash = models.CharField(max_length=66, blank=True)
    # why it closed: "count" (SETTLEMENT_BATCH_MAX contributions waited), "deadline" (the
    # oldest waited SETTLEMENT_DEADLINE_S) or "manual" (gpuflex manage settle_chain)
    closed_reason = models.CharField(max_length=12, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    posted_at = models.DateTimeField(null=True, blank=True)
    anchored_at = models.DateTimeField(null=True, blank=True)


class ProvenanceAnchor(models.Model):
    """A round's provenance record hash, anchored in the ProvenanceRegistry exactly once: the
    head (last record) of every completed job, and every round's record when the job's spec
    asks (provenance.anchor_rounds). Stored before it is sent, with the operator nonce, so a
    restart finishes it and never sends it twice."""

    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="anchors")
    round = models.PositiveIntegerField()
    record_hash = models.CharField(max_length=64)
    head = models.BooleanField(default=False, help_text="the completed job's last record")
    nonce = models.PositiveBigIntegerField(null=True, blank=True)
    anchored = models.BooleanField(default=False)
    tx_hash = models.CharField(max_length=66, blank=True)
    block_number = models.PositiveBigIntegerField(null=True, blank=True)
    failed = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    anchored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "round"], name="anchor_one_per_round")
        ]


class WalletAddress(models.Model):
    """The address a user pays from (buyer deposits) or is paid to; one per user."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="wallet"
    )
    address = models.CharField(max_length=42, unique=True)


class HoldState(models.TextChoices):
    HELD = "held"  # not withdrawable until `until` (or its result is verified); see holds.py
    FORFEITED = "forfeited"  # its node failed verification first: refunded to the buyer


class EarningsHold(models.Model):
    """A volunteer's earnings from one charged, unverified result, held from payout until
    `until` (PAYOUT_HOLD_S after the charge) and forfeited if any result of its node fails
    verification first (docs/money.md, "Cheating does not pay").

    Not an entry, as a Reservation is not: the earnings account keeps the money, and what a
    provider may withdraw is its balance less its holds still running. A hold is released by
    time (`until` passes) or by a replica agreeing with its result (`verified`), both read
    from the rows at the time asked: no task has to run for a hold to end."""

    charge = models.OneToOneField(Transaction, on_delete=models.PROTECT, related_name="hold")
    node = models.ForeignKey("nodes.Node", on_delete=models.PROTECT, related_name="holds")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="earnings_holds"
    )
    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="earnings_holds")
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    amount = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)  # net
    fee = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    until = models.DateTimeField()
    state = models.CharField(max_length=12, choices=HoldState.choices, default=HoldState.HELD)
    forfeit = models.ForeignKey(
        Transaction, null=True, blank=True, on_delete=models.PROTECT, related_name="forfeited"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["user", "until"], condition=models.Q(state="held"), name="hold_user_held"
            ),
            models.Index(
                fields=["node", "until"], condition=models.Q(state="held"), name="hold_node_held"
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gte=0), name="hold_not_negative")
        ]


class ReservationState(models.TextChoices):
    OPEN = "open"  # held against the job's escrow while the lease runs or awaits settlement
    CONVERTED = "converted"  # its task's result was charged (at most the reserved amount)
    RELEASED = "released"  # lease lost, failed, rejected, or the job ended: nothing charged


class Reservation(models.Model):
    """A lease's most possible charge, held against its job's escrow (docs/money.md, "Budgets").

    Not an entry: escrow keeps the money, and a job's *free* escrow is its balance less its
    open reservations. A job leases a task only when its free escrow covers the reservation,
    so the charge that follows never finds the escrow short. The amount shrinks to the
    result's own bound at upload; the row is converted when the result is charged and
    released otherwise."""

    # the bulk lease inserts thousands at once: no index beyond what the reads need (open
    # ones by task and by job, below; the task's own for cascades)
    task = models.ForeignKey("rounds.Task", on_delete=models.CASCADE, related_name="reservations")
    job = models.ForeignKey(
        "jobs.Job", on_delete=models.CASCADE, related_name="reservations", db_index=False
    )
    node = models.ForeignKey(
        "nodes.Node", on_delete=models.CASCADE, related_name="reservations", db_index=False
    )
    amount = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    # the bounds the amount was computed with: the charge never exceeds either
    seconds = models.FloatField()
    speed = models.FloatField()
    state = models.CharField(
        max_length=12, choices=ReservationState.choices, default=ReservationState.OPEN
    )
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # one lease at a time per task, so one open reservation
            models.UniqueConstraint(
                fields=["task"], condition=models.Q(state="open"), name="reservation_one_open"
            ),
            models.CheckConstraint(
                condition=models.Q(amount__gte=0), name="reservation_not_negative"
            ),
        ]
        indexes = [
            models.Index(
                fields=["job"], condition=models.Q(state="open"), name="reservation_open_job"
            )
        ]


class NodeRegistration(models.Model):
    """A provider's wallet and the capability hash of its nodes, registered in the NodeRegistry
    (by the operator: `registerFor`) when the provider links the wallet; sent once like every
    operator transaction (chain_once). A changed hash is a new row (NodeUpdated on chain)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="node_registrations"
    )
    address = models.CharField(max_length=42)
    capability_hash = models.CharField(max_length=66)
    nonce = models.PositiveBigIntegerField(null=True, blank=True)
    registered = models.BooleanField(default=False)
    tx_hash = models.CharField(max_length=66, blank=True)
    failed = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["address", "capability_hash"], name="registration_once")
        ]


class EscrowFloor(models.Model):
    """A lower bound of a job's free escrow, so that a claim's reservation need not sum every
    open reservation and escrow entry of its job (issue 36: that sum grew with the leases out,
    a claim's largest cost in PostgreSQL). Written only by `gpuflex_reserve` under the job's
    escrow lock, as exact free escrow less what each claim since reserved: everything else
    only raises free escrow (releasing, shrinking and converting reservations; a charge
    takes at most its reservation), except escrow entries, so `entries` is the count of the
    job's escrow entries it was computed with and a floor counts only while that count
    holds (an entry is never deleted). A reservation made elsewhere (the bulk lease) deletes
    it. Never money: `free_escrow` computes the exact figure."""

    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="escrow_floor"
    )
    free = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    entries = models.PositiveBigIntegerField()
