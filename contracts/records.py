"""Typed values the chain glue hands to its callers (the ledger, the CLI, tests).

Amounts are integers in the token's base units (wei for the native currency, 10**-decimals of
an ERC-20); converting to ``Decimal`` and choosing the currency is the ledger's business.
Addresses are EIP-55 checksummed strings; ids and hashes are 32 raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_typing import ChecksumAddress

NATIVE: ChecksumAddress = ChecksumAddress("0x0000000000000000000000000000000000000000")
"""The token address that stands for the chain's native currency."""


@dataclass(frozen=True)
class EventRef:
    """Where an event was logged; ``(tx_hash, log_index)`` identifies it for good, so a caller
    that records it can process every event exactly once across restarts and re-reads."""

    block_number: int
    tx_hash: bytes
    log_index: int

    @property
    def key(self) -> str:
        return f"{self.tx_hash.hex()}:{self.log_index}"


@dataclass(frozen=True)
class DepositRecord:
    job_id: bytes
    buyer: ChecksumAddress
    token: ChecksumAddress
    amount: int
    ref: EventRef


@dataclass(frozen=True)
class ClaimRecord:
    batch_id: bytes
    provider: ChecksumAddress
    token: ChecksumAddress
    amount: int
    ref: EventRef


@dataclass(frozen=True)
class RefundRecord:
    job_id: bytes
    buyer: ChecksumAddress
    token: ChecksumAddress
    amount: int
    ref: EventRef


@dataclass(frozen=True)
class PostedBatch:
    batch_id: bytes
    root: bytes
    token: ChecksumAddress
    total: int
    gas_used: int
    ref: EventRef


@dataclass(frozen=True)
class JobEscrow:
    """A job's escrow as the contract holds it; ``buyer`` is NATIVE (zero) for an unknown job."""

    job_id: bytes
    buyer: ChecksumAddress
    token: ChecksumAddress
    deposited: int
    settled: int
    refunded: int
    closed: bool

    @property
    def exists(self) -> bool:
        return self.buyer != NATIVE

    @property
    def remaining(self) -> int:
        return self.deposited - self.settled - self.refunded


@dataclass(frozen=True)
class BatchState:
    batch_id: bytes
    root: bytes
    token: ChecksumAddress
    total: int
    claimed: int


@dataclass(frozen=True)
class NodeInfo:
    address: ChecksumAddress
    capability_hash: bytes
    registered_at_block: int
    active: bool


@dataclass(frozen=True)
class AnchorRecord:
    job_id: bytes
    round: int
    record_hash: bytes
    block_number: int
    timestamp: int


@dataclass(frozen=True)
class ContributionAnchor:
    """A settlement batch's contribution root as the ProvenanceRegistry holds it."""

    batch_id: bytes
    root: bytes
    leaves: int
    block_number: int
    timestamp: int
