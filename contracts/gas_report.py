"""Gas per settled contribution and per claim, measured on the in-process EVM.

``python -m contracts.gas_report [--out gas.json] [--batch 1000] [--claims 25] [--check]
[--sizes 10,24,1000]`` prints a table and writes JSON. A contribution is one verified task
result; a settlement batch of N of them costs the operator two transactions whose cost does
not grow with N: posting the payouts' Merkle root (one leaf per provider paid) and anchoring
the contribution root (one leaf per node). Their gas divided by N is what each contribution
costs. ``--sizes`` reports that at the batch sizes a deadline produces (the 30 s deadline
closes batches of whatever arrived in 30 s). Claims are paid by whoever submits them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from eth_utils import keccak, to_checksum_address
from web3.contract import Contract

from contracts.client import ChainClient
from contracts.contributions import ContributionTree, NodeContribution
from contracts.records import NATIVE
from contracts.settlement import JobDebit, Payout, SettlementBatch

GOAL_GAS_PER_CONTRIBUTION = 1_000


@dataclass(frozen=True)
class GasReport:
    currency: str  # "native" or "erc20"
    batch_size: int  # leaves (contributions) in the batch
    jobs: int  # job escrows the batch debits
    post_batch_gas: int
    anchor_gas: int  # the batch's contribution root, anchored in the ProvenanceRegistry
    gas_per_contribution: float  # (post_batch_gas + anchor_gas) / batch_size
    claims_measured: int
    claim_gas_min: int
    claim_gas_mean: float
    claim_gas_max: int
    proof_length: int
    deposit_gas: int
    fresh_providers: bool  # claims pay providers with no balance yet (the worst case)


def _providers(n: int) -> list[str]:
    # Fresh addresses, as real providers' first payouts are: the claim pays for creating the
    # account (native) or the balance slot (ERC-20), the worst case.
    return [to_checksum_address(keccak(text=f"provider {i}")[-20:]) for i in range(n)]


def measure(
    batch_size: int = 1_000,
    claims: int = 25,
    jobs: int = 1,
    erc20: bool = False,
    fresh_providers: bool = True,
) -> GasReport:
    """Post one batch of ``batch_size`` leaves debited from ``jobs`` jobs, then claim
    ``claims`` of them (spread over the batch; 0 claims every leaf). With
    ``fresh_providers=False`` the claimed providers already hold some of the token, as a
    provider paid before does."""
    client = ChainClient.embedded()
    accounts = client.w3.eth.accounts
    admin, buyer, relayer = accounts[0], accounts[2], accounts[3]
    amount = 10**6
    total = amount * batch_size
    token = NATIVE
    mock: Contract | None = None
    if erc20:
        mock = client.deploy_contract("MockERC20", "Test USD", "TUSD", 6, sender=admin)
        client.allow_token(mock.address)
        client.transact(mock.functions.mint(buyer, total), admin)
        token = mock.address

    per_job = [total // jobs + (1 if i < total % jobs else 0) for i in range(jobs)]
    deposit_gas = 0
    for i, share in enumerate(per_job):
        receipt = client.deposit(f"gas-job-{i}", share, buyer, token=token)
        deposit_gas = int(receipt["gasUsed"])
    providers = _providers(batch_size)
    batch = SettlementBatch.build(
        "gas-batch",
        [Payout(p, amount) for p in providers],
        [JobDebit(f"gas-job-{i}", share) for i, share in enumerate(per_job)],
        token=token,
    )
    posted = client.post_batch(batch)
    tree = ContributionTree.build(
        "gas-batch", [NodeContribution(i + 1, 1, 32, amount) for i in range(batch_size)]
    )
    anchor_gas = int(client.anchor_contributions("gas-batch", tree.root, batch_size)["gasUsed"])

    count = batch_size if claims <= 0 else min(claims, batch_size)
    step = batch_size / count
    sample = [providers[int(i * step)] for i in range(count)]
    if not fresh_providers:
        for provider in sample:
            if mock is not None:
                client.transact(mock.functions.mint(provider, 1), admin)
            else:
                tx = client.w3.eth.send_transaction({"from": admin, "to": provider, "value": 1})
                client.w3.eth.wait_for_transaction_receipt(tx)
    used: list[int] = []
    for provider in sample:
        proof = batch.proof_for(provider)
        fn = client.escrow.functions.claim(
            proof.batch_id, proof.provider, proof.amount, list(proof.proof)
        )
        used.append(int(client.transact(fn, relayer)["gasUsed"]))

    return GasReport(
        currency="erc20" if erc20 else "native",
        batch_size=batch_size,
        jobs=jobs,
        post_batch_gas=posted.gas_used,
        anchor_gas=anchor_gas,
        gas_per_contribution=(posted.gas_used + anchor_gas) / batch_size,
        claims_measured=len(used),
        claim_gas_min=min(used),
        claim_gas_mean=statistics.fmean(used),
        claim_gas_max=max(used),
        proof_length=len(batch.proof_for(providers[0]).proof),
        deposit_gas=deposit_gas,
        fresh_providers=fresh_providers,
    )


def full_report(batch_size: int = 1_000, claims: int = 25) -> list[GasReport]:
    return [
        measure(batch_size, claims, jobs=1),
        measure(batch_size, claims, jobs=10),
        measure(batch_size, claims, jobs=1, fresh_providers=False),
        measure(batch_size, claims, jobs=1, erc20=True),
        measure(batch_size, claims, jobs=1, erc20=True, fresh_providers=False),
    ]


def format_report(reports: list[GasReport]) -> str:
    lines = [
        f"{'currency':8} {'leaves':>6} {'jobs':>4} {'post gas':>9} {'anchor':>7} "
        f"{'gas/contrib':>11} {'claim min/mean/max':>24} {'proof':>5}  providers"
    ]
    for r in reports:
        claim = f"{r.claim_gas_min}/{r.claim_gas_mean:.0f}/{r.claim_gas_max}"
        lines.append(
            f"{r.currency:8} {r.batch_size:>6} {r.jobs:>4} {r.post_batch_gas:>9} {r.anchor_gas:>7} "
            f"{r.gas_per_contribution:>11.1f} {claim:>24} {r.proof_length:>5}  "
            f"{'fresh' if r.fresh_providers else 'paid before'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("contracts-gas-report.json"))
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--claims", type=int, default=25, help="claims to measure; 0 = all")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when gas per contribution is over the goal"
    )
    parser.add_argument(
        "--sizes",
        default="",
        help="comma-separated batch sizes: report gas per contribution at each (native, 1 job)",
    )
    args = parser.parse_args(argv)
    if args.sizes:
        reports = [measure(int(n), min(args.claims, int(n)) or 1) for n in args.sizes.split(",")]
    else:
        reports = full_report(args.batch, args.claims)
    print(format_report(reports))
    payload = {
        "goal_gas_per_contribution": GOAL_GAS_PER_CONTRIBUTION,
        "reports": [asdict(r) for r in reports],
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    over = [r for r in reports if r.gas_per_contribution > GOAL_GAS_PER_CONTRIBUTION]
    return 1 if args.check and over else 0


if __name__ == "__main__":
    raise SystemExit(main())
