"""GPUFlex on-chain settlement: Solidity contracts (src/, compiled into build/) and their
Python glue. Needs the ``chain`` extra (web3.py, eth-tester with py-evm); with the chain
disabled, do not import this package at all. Start from ``ChainClient``; docs/contracts.md
walks through it."""

from contracts.client import ChainClient
from contracts.contributions import ContributionProof, ContributionTree, NodeContribution
from contracts.deploy import Deployment, deploy
from contracts.errors import ChainError
from contracts.ids import to_bytes32
from contracts.records import (
    NATIVE,
    AnchorRecord,
    BatchState,
    ClaimRecord,
    DepositRecord,
    EventRef,
    JobEscrow,
    NodeInfo,
    PostedBatch,
    RefundRecord,
)
from contracts.settlement import ClaimProof, JobDebit, Payout, SettlementBatch

__all__ = [
    "NATIVE",
    "AnchorRecord",
    "BatchState",
    "ChainClient",
    "ChainError",
    "ClaimProof",
    "ClaimRecord",
    "ContributionProof",
    "ContributionTree",
    "Deployment",
    "DepositRecord",
    "EventRef",
    "JobDebit",
    "JobEscrow",
    "NodeContribution",
    "NodeInfo",
    "Payout",
    "PostedBatch",
    "RefundRecord",
    "SettlementBatch",
    "deploy",
    "to_bytes32",
]
