"""Settlement batches built off-chain: payouts, the job debits that fund them, the Merkle tree.

A batch pays one token. Its payouts are aggregated to one leaf per provider (a provider who did
forty tasks gets one claim), its total must equal the sum of the job debits, and it can be
written to JSON and read back, so the ledger can store it and serve proofs long after posting.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eth_typing import ChecksumAddress
from eth_utils import to_checksum_address

from contracts import merkle
from contracts.ids import Bytes32Like, to_bytes32
from contracts.records import NATIVE


@dataclass(frozen=True)
class Payout:
    provider: str
    amount: int


@dataclass(frozen=True)
class JobDebit:
    job_id: Bytes32Like
    amount: int


@dataclass(frozen=True)
class ClaimProof:
    """Everything a provider needs to call ``claim``; JSON-friendly via ``to_dict``."""

    batch_id: bytes
    provider: ChecksumAddress
    token: ChecksumAddress
    amount: int
    proof: tuple[bytes, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": "0x" + self.batch_id.hex(),
            "provider": self.provider,
            "token": self.token,
            "amount": str(self.amount),
            "proof": ["0x" + p.hex() for p in self.proof],
        }


@dataclass(frozen=True)
class SettlementBatch:
    batch_id: bytes
    token: ChecksumAddress
    payouts: tuple[tuple[ChecksumAddress, int], ...]  # (provider, amount), one per provider
    debits: tuple[tuple[bytes, int], ...]  # (job id, amount), one per job
    tree: merkle.MerkleTree = field(repr=False, compare=False)

    @classmethod
    def build(
        cls,
        batch_id: Bytes32Like,
        payouts: Iterable[Payout],
        debits: Iterable[JobDebit],
        token: str = NATIVE,
    ) -> SettlementBatch:
        paid: dict[ChecksumAddress, int] = {}
        for p in payouts:
            if p.amount <= 0:
                raise ValueError(f"payout amounts must be positive: {p}")
            provider = to_checksum_address(p.provider)
            if provider == NATIVE:
                raise ValueError("cannot pay the zero address")
            paid[provider] = paid.get(provider, 0) + p.amount
        debited: dict[bytes, int] = {}
        for d in debits:
            if d.amount <= 0:
                raise ValueError(f"debit amounts must be positive: {d}")
            key = to_bytes32(d.job_id)
            debited[key] = debited.get(key, 0) + d.amount
        if not paid:
            raise ValueError("a batch needs at least one payout")
        if sum(paid.values()) != sum(debited.values()):
            # The contract only sees the debits; claims beyond them would be refused on-chain,
            # debits beyond the claims would strand money in the contract. Both are bugs here.
            raise ValueError(
                f"payouts ({sum(paid.values())}) and debits ({sum(debited.values())}) differ"
            )
        token_addr = to_checksum_address(token)
        pairs = tuple(sorted(paid.items()))
        tree = merkle.MerkleTree([merkle.leaf_hash(a, token_addr, n) for a, n in pairs])
        return cls(
            batch_id=to_bytes32(batch_id),
            token=token_addr,
            payouts=pairs,
            debits=tuple(sorted(debited.items())),
            tree=tree,
        )

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def total(self) -> int:
        return sum(amount for _, amount in self.payouts)

    def amount_for(self, provider: str) -> int:
        wanted = to_checksum_address(provider)
        for address, amount in self.payouts:
            if address == wanted:
                return amount
        raise KeyError(f"{wanted} has no payout in this batch")

    def proof_for(self, provider: str) -> ClaimProof:
        address = to_checksum_address(provider)
        amount = self.amount_for(address)
        leaf = merkle.leaf_hash(address, self.token, amount)
        return ClaimProof(
            batch_id=self.batch_id,
            provider=address,
            token=self.token,
            amount=amount,
            proof=tuple(self.tree.proof(leaf)),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "batch_id": "0x" + self.batch_id.hex(),
                "token": self.token,
                "root": "0x" + self.root.hex(),
                "payouts": [[a, str(n)] for a, n in self.payouts],
                "debits": [["0x" + j.hex(), str(n)] for j, n in self.debits],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> SettlementBatch:
        data = json.loads(text)
        batch = cls.build(
            batch_id=data["batch_id"],
            payouts=[Payout(a, int(n)) for a, n in data["payouts"]],
            debits=[JobDebit(j, int(n)) for j, n in data["debits"]],
            token=data["token"],
        )
        if "0x" + batch.root.hex() != data["root"]:
            raise ValueError("stored root does not match the stored payouts")
        return batch
