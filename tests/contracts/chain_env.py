"""Shared test helpers for the chain tests (the fixtures that build them are in conftest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from web3.contract import Contract

from contracts import ChainClient, ChainError, JobDebit, Payout, SettlementBatch
from contracts.records import NATIVE

STABLE_DECIMALS = 6
ETH = 10**18


@dataclass
class Env:
    client: ChainClient
    token: Contract  # an allowed mock stablecoin
    admin: str
    operator: str
    buyer: str
    buyer2: str
    providers: list[str]
    outsider: str

    def balance(self, who: str, token: str = NATIVE) -> int:
        if token == NATIVE:
            return int(self.client.w3.eth.get_balance(who))
        return int(self.token.functions.balanceOf(who).call())

    def settle(
        self,
        batch_id: str,
        job: str,
        amounts: Sequence[int],
        token: str = NATIVE,
    ) -> SettlementBatch:
        """Post a batch paying ``amounts`` to the first providers, all debited from ``job``."""
        batch = SettlementBatch.build(
            batch_id,
            [Payout(p, a) for p, a in zip(self.providers, amounts, strict=False)],
            [JobDebit(job, sum(amounts))],
            token=token,
        )
        self.client.post_batch(batch)
        return batch


def error_name(exc: BaseException) -> str:
    assert isinstance(exc, ChainError), exc
    return exc.name
