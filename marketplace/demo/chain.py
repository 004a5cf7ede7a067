"""`gpuflex demo --chain`: the demo settled on a real JSON-RPC chain, and what it measures.

A Hardhat node (contracts/hardhat_node.py) is started with the contracts deployed; the
marketplace's processes get the settings its chain path reads (GPUFLEX_CHAIN_URL, _DEPLOYMENT,
_OPERATOR_KEY), so the worker's settle_chain beat closes settlement batches exactly as in
production. Each verified contribution (a charged task result) is settled once the batch
holding its charge is on chain: its payouts part posted and its contribution root, with the
node's (contributions, samples, earnings) leaf, anchored in the ProvenanceRegistry.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from contracts.hardhat_node import RpcChain

# how long the demo waits, after the job ends, for the last contributions' batch to land: the
# batch deadline (GPUFLEX_SETTLEMENT_DEADLINE_S, 20 s) plus the beat's period, with room
SETTLE_WAIT_S = 180.0


def chain_env(node: RpcChain) -> dict[str, str]:
    """What every marketplace process reads to settle on `node`."""
    return {
        "GPUFLEX_CHAIN_URL": node.url,
        "GPUFLEX_CHAIN_DEPLOYMENT": node.deployment_json,
        "GPUFLEX_CHAIN_OPERATOR_KEY": node.operator_key,
    }


def _charges(job_id: str) -> Any:
    from marketplace.ledger.models import Transaction, TxKind

    return Transaction.objects.filter(
        job_id=job_id, kind=TxKind.CHARGE, task_result__isnull=False
    ).select_related("task_result__task__round", "settlement")


def unsettled(job_id: str) -> int:
    """The job's verified contributions whose batch is not on chain yet."""
    return sum(1 for tx in _charges(job_id) if not _settled_at(tx))


def wait_settled(job_id: str, timeout_s: float = SETTLE_WAIT_S) -> int:
    """Wait for the worker to settle the job's contributions; returns how many are left."""
    end = time.monotonic() + timeout_s
    while (left := unsettled(job_id)) and time.monotonic() < end:
        time.sleep(1.0)  # polling the ledger's state, not a synchronisation by time
    return left


def _settled_at(tx: Any) -> Any:
    """When the charge's batch was confirmed on chain in full, or None."""
    record = tx.settlement
    if record is None or record.failed or not record.posted or not record.anchored:
        return None
    return max(t for t in (record.posted_at, record.anchored_at) if t is not None)


def settlement_figures(job_id: str) -> dict[str, Any]:
    """Per verified contribution, upload accepted (its TaskResult written) to its batch
    confirmed on chain; per round, contributions whose leaf the chain itself verifies
    against the anchored root, beside the round's verified contributions."""
    from django.conf import settings

    from contracts import ContributionProof
    from marketplace.ledger.chain import chain_client, contribution_proof

    client = chain_client()
    assert client is not None, "the demo's chain is not configured"
    latencies: list[float] = []
    to_verified: list[float] = []  # upload accepted to charged: the part before batching
    per_round: dict[int, dict[str, int]] = {}
    leaf_ok: dict[tuple[int, int], bool] = {}  # (record, node) -> the chain verifies the leaf
    for tx in _charges(job_id):
        result = tx.task_result
        row = per_round.setdefault(result.task.round.number, {"verified": 0, "on_chain": 0})
        row["verified"] += 1
        settled = _settled_at(tx)
        if settled is None:
            continue
        latencies.append((settled - result.created_at).total_seconds())
        to_verified.append((tx.created_at - result.created_at).total_seconds())
        key = (tx.settlement_id, int(tx.node_id))
        if key not in leaf_ok:
            proof = ContributionProof.from_dict(contribution_proof(tx.settlement, key[1]))
            leaf_ok[key] = client.verify_contribution(proof)
        row["on_chain"] += int(leaf_ok[key])
    rounds = [{"round": n} | per_round[n] for n in sorted(per_round)]
    verified = sum(r["verified"] for r in rounds)
    on_chain = sum(r["on_chain"] for r in rounds)
    return {
        "contributions": verified,
        "settled": len(latencies),
        "settlement_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "settlement_max_s": round(max(latencies), 2) if latencies else None,
        "upload_to_verified_max_s": round(max(to_verified), 2) if to_verified else None,
        # a batch closes once its oldest contribution has waited this long (or is full)
        "batch_deadline_s": float(settings.CHAIN["DEADLINE_S"]),
        "on_chain_records": on_chain,
        "on_chain_per_round": rounds,
        "every_contribution_on_chain": bool(verified) and on_chain == verified,
    }


def print_figures(figures: dict[str, Any], write: Any = print) -> None:
    write(
        f"settlement on chain: {figures['settled']} of {figures['contributions']} verified "
        f"contributions settled; upload accepted to confirmed on chain "
        f"p50 {figures['settlement_p50_s']} s, max {figures['settlement_max_s']} s"
    )
    rows = ", ".join(
        f"round {r['round']}: {r['on_chain']}/{r['verified']}"
        for r in figures["on_chain_per_round"]
    )
    write(f"records on chain per round (on chain / verified): {rows}")
