"""`gpuflex verify JOB`: check a downloaded model against the chain, trusting no marketplace.

Three checks, each reported on its own:

1. **model**: the downloaded weights hash (trainer.hashing.state_hash) to the output model of
   the provenance chain's last record;
2. **provenance**: the chain is intact (record hashes, prev_hash links, round numbers, each
   round starting from the previous round's output: trainer.provenance.verify_chain);
3. **anchor**: read from the chain itself (a JSON-RPC URL the buyer chooses), the
   ProvenanceRegistry holds exactly the head's record hash for (job, last round), and the
   transaction the marketplace names as the anchor did emit that ProvenanceAnchored event
   from that registry.

The marketplace only says where to look (registry address, job key, transaction); everything
is then checked against the chain. Needs the ``chain`` extra (web3) for the third check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.hashing import state_hash
from trainer.provenance_chain import ProvenanceChain, verify_chain
from trainer.updates import decode_state


@dataclass
class Verification:
    job: str
    checks: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def fail(self, check: str, problem: str) -> None:
        self.checks[check] = False
        self.problems.append(problem)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "ok": self.ok, "checks": self.checks,
                "problems": self.problems, "details": self.details}  # fmt: skip


def verify_download(
    model_file: Path, provenance_file: Path, anchors: dict[str, Any], chain_url: str
) -> Verification:
    """Check a model (safetensors) and provenance record downloaded for a job against the
    chain at `chain_url`, using `anchors` (GET jobs/<id>/anchors) only to know where to look."""
    chain = ProvenanceChain.from_json(provenance_file.read_text("utf-8"))
    result = Verification(job=chain.job)
    if not chain.records:
        result.fail("provenance", "the provenance record has no rounds")
        return result
    head = chain.records[-1]
    result.details |= {"round": head.round, "record_hash": head.record_hash}

    state, _ = decode_state(model_file.read_bytes())
    digest = state_hash(state)
    result.details["model_hash"] = digest
    result.checks["model"] = digest == head.output_model_hash
    if not result.checks["model"]:
        result.problems.append(
            f"the model hashes to {digest}, the provenance head's output is "
            f"{head.output_model_hash}"
        )

    report = verify_chain(chain)
    result.checks["provenance"] = report.ok
    result.problems += report.problems

    _check_anchor(result, chain, anchors, chain_url)
    return result


def _check_anchor(
    result: Verification, chain: ProvenanceChain, anchors: dict[str, Any], chain_url: str
) -> None:
    from eth_utils import to_checksum_address
    from web3.logs import DISCARD

    from contracts.artifacts import PROVENANCE, load_artifact
    from contracts.connection import rpc_web3
    from contracts.ids import to_bytes32

    head = chain.records[-1]
    mine = [a for a in anchors.get("anchors", []) if a["round"] == head.round]
    if not mine or not mine[0].get("anchored"):
        result.fail("anchor", f"the marketplace names no anchor for round {head.round} yet")
        return
    w3, _ = rpc_web3(chain_url)
    if anchors.get("chain_id") is not None and int(w3.eth.chain_id) != int(anchors["chain_id"]):
        result.fail("anchor", f"{chain_url} is chain {w3.eth.chain_id}, not {anchors['chain_id']}")
        return
    registry = w3.eth.contract(
        address=to_checksum_address(anchors["provenance_registry"]),
        abi=load_artifact(PROVENANCE).abi,
    )
    job_key = to_bytes32(anchors["job_key"])
    if job_key != to_bytes32(_job_uuid(chain.job)):
        result.fail("anchor", f"the anchor's job key is not job {chain.job}'s")
        return
    # the hash of the record as it reads, not its own record_hash field: a rewritten record
    # keeps the field, and must not pass for the anchored one
    computed = head.compute_hash()
    digest = bytes.fromhex(computed)
    on_chain = bool(registry.functions.verify(job_key, head.round, digest).call())
    tx_hash = mine[0]["tx_hash"]
    receipt = w3.eth.get_transaction_receipt(tx_hash)
    events = registry.events.ProvenanceAnchored().process_receipt(receipt, errors=DISCARD)
    in_tx = any(
        bytes(e["args"]["jobId"]) == job_key
        and int(e["args"]["round"]) == head.round
        and bytes(e["args"]["recordHash"]) == digest
        and e["address"] == registry.address
        for e in events
    )
    result.details |= {"anchor_tx": tx_hash, "anchor_block": int(receipt["blockNumber"]),
                       "registry": registry.address}  # fmt: skip
    result.checks["anchor"] = on_chain and in_tx
    if not on_chain:
        result.problems.append(
            f"the registry does not hold {computed} (the head record's hash) for round {head.round}"
        )
    if not in_tx:
        result.problems.append(f"transaction {tx_hash} did not anchor that record")


def _job_uuid(job: str) -> Any:
    from uuid import UUID

    return UUID(job)


def check_contribution(proof: dict[str, Any], chain_url: str | None = None) -> dict[str, Any]:
    """Check a node's contribution proof (GET nodes/<id>/contributions): the leaf against the
    proof's root here, and with `chain_url`, against the root anchored on chain for the batch
    (ProvenanceRegistry.verifyContribution, read from the chain itself)."""
    from contracts.contributions import ContributionProof

    parsed = ContributionProof.from_dict(proof)
    out: dict[str, Any] = {"batch_id": proof["batch_id"], "in_root": parsed.verify()}
    if chain_url:
        from eth_utils import to_checksum_address

        from contracts.artifacts import PROVENANCE, load_artifact
        from contracts.connection import rpc_web3

        w3, _ = rpc_web3(chain_url)
        registry = w3.eth.contract(
            address=to_checksum_address(proof["provenance_registry"]),
            abi=load_artifact(PROVENANCE).abi,
        )
        out["on_chain"] = bool(registry.functions.verifyContribution(*parsed.call_args()).call())
    out["ok"] = all(v for k, v in out.items() if k in ("in_root", "on_chain"))
    return out


def format_verification(v: Verification) -> str:
    lines = [f"job {v.job}: {'VERIFIED' if v.ok else 'NOT VERIFIED'}"]
    for name, passed in v.checks.items():
        lines.append(f"  {name:10} {'ok' if passed else 'FAILED'}")
    lines += [f"  - {p}" for p in v.problems]
    if "anchor_tx" in v.details:
        lines.append(f"  anchored in {v.details['anchor_tx']} (block {v.details['anchor_block']})")
    return "\n".join(lines)


def dumps(v: Verification) -> str:
    return json.dumps(v.to_dict(), indent=1)
