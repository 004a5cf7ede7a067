"""What the demo shows at the end, read from the marketplace's database and files: accuracy
per round, per-node work and earnings, the buyer's bill, the ledger and the provenance."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone


def job_timing(job: Any) -> dict[str, Any]:
    """The job's wall time, from its first round opening to its end (its last aggregation
    done: `finished_at`; for a job still running, now), the time to its target (None unless
    reached: a job ends at the round that reaches it) and the compute utilization.

    Utilization is defined exactly as the simulator's (trainer.sim.report.SimResult
    .utilization): compute seconds summed over nodes / (nodes x wall seconds), here with the
    compute the nodes reported on their accepted uploads (TaskResult.compute_s; work whose
    upload came too late for its round is not seen by the server) and the nodes that moved
    any bytes for the job (NodeTraffic).
    """
    from marketplace.nodes.models import NodeTraffic
    from marketplace.rounds.models import Round, Task, TaskResult

    first = Round.objects.filter(job=job).order_by("number").first()
    if first is None:
        return {"job_wall_s": None, "time_to_target_s": None, "utilization": None,
                "submit_to_first_lease_s": None}  # fmt: skip
    # the job row is written once its upload (spec and dataset) has been received whole
    leased = Task.objects.filter(round=first).aggregate(t=Min("leased_at"))["t"]
    to_lease = (leased - job.created_at).total_seconds() if leased else None
    ended: datetime = job.finished_at or timezone.now()
    wall = max((ended - first.opened_at).total_seconds(), 0.0)
    compute = TaskResult.objects.filter(task__round__job=job).aggregate(s=Sum("compute_s"))["s"]
    nodes = NodeTraffic.objects.filter(job=job).count()
    return {
        "job_wall_s": round(wall, 2),
        "time_to_target_s": round(wall, 2) if job.reached_target else None,
        "utilization": round(float(compute or 0.0) / (nodes * wall), 4) if nodes and wall else None,
        "submit_to_first_lease_s": round(to_lease, 3) if to_lease is not None else None,
    }


def summarize(job_id: str, plans: dict[str, Any]) -> dict[str, Any]:
    from marketplace.jobs import files
    from marketplace.jobs.models import Job
    from marketplace.ledger.reconcile import reconcile
    from marketplace.ledger.selectors import job_costs, node_earnings
    from marketplace.nodes.models import Node
    from marketplace.nodes.selectors import job_traffic
    from marketplace.rounds.aggregation import artifact_store, provenance_name
    from marketplace.rounds.models import Round, Task, TaskResult
    from trainer.provenance import ProvenanceChain, verify_with_artifacts

    job = Job.objects.get(pk=job_id)
    rounds = list(Round.objects.filter(job=job, status="done").order_by("number"))
    costs = job_costs(job)
    nodes = []
    traffic = job_traffic(job.pk)
    results = TaskResult.objects.filter(task__round__job=job)
    ran_on: dict[int, set[tuple[str, str]]] = {}
    for node_id, device, precision in results.values_list("node_id", "device", "precision"):
        ran_on.setdefault(node_id, set()).add((device or "unknown", precision))
    for node in Node.objects.annotate(
        uploaded=Count("results", filter=Q(results__task__round__job=job)),
        verified=Count("results", filter=Q(results__task__round__job=job, results__credited=True)),
        rejected=Count("results", filter=Q(results__task__round__job=job, results__accepted=False)),
        samples=Sum("results__num_samples", filter=Q(results__task__round__job=job)),
        compute=Sum("results__compute_s", filter=Q(results__task__round__job=job)),
    ).order_by("pk"):
        plan = plans.get(node.name, {})
        nodes.append(
            {
                "name": node.name,
                "kind": node.kind,
                "network_profile": plan.get("profile", ""),
                "compute_scale": plan.get("compute_scale", 1.0),
                "price_per_gpu_hour": str(node.price_per_gpu_hour),
                "tasks": node.uploaded,
                "verified": node.verified,
                "rejected": node.rejected,
                "lost_leases": node.lost_leases,
                "samples": int(node.samples or 0),
                "compute_s": round(float(node.compute or 0.0), 2),
                "earnings": node_earnings(node)["total"],
                # payload bytes, from the server's own counters (NodeTraffic)
                "bytes_up": traffic.get(node.pk, {}).get("bytes_up", 0),
                "bytes_down": traffic.get(node.pk, {}).get("bytes_down", 0),
                # where its tasks trained: "cuda" on a GPU machine, in bf16 where it has it
                "devices": sorted({d for d, _ in ran_on.get(node.pk, ())}),
                "ran_on": sorted(f"{d} {p}" for d, p in ran_on.get(node.pk, ())),
            }
        )
    verified = False
    if rounds:
        chain = ProvenanceChain.from_json(files.get(provenance_name(job)).decode())
        report = verify_with_artifacts(
            chain, artifact_store(), job.parsed_spec.aggregation, expected_head=None
        )
        verified = bool(report.ok and chain.records[-1].output_model_hash == job.model_hash)
    ledger = reconcile(with_chain=False)
    # an update counted twice would be two aggregated results for one shard in one round
    doubles = (
        results.filter(aggregated=True, task__shard__isnull=False)
        .values("task__round", "task__shard")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .count()
    )
    return {
        "job_id": str(job.pk),
        "status": job.status,
        "reached_target": job.reached_target,
        "final_accuracy": rounds[-1].metrics["accuracy"] if rounds else None,
        "rounds": len(rounds),
        # the job's own time: submitted (its row written) to finished (its last round done)
        "submit_to_end_s": round(
            ((job.finished_at or timezone.now()) - job.created_at).total_seconds(), 1
        ),
        "accuracy_per_round": [round(r.metrics["accuracy"], 4) for r in rounds],
        "round_seconds": [
            round((r.closed_at - r.opened_at).total_seconds(), 2) if r.closed_at else None
            for r in rounds
        ],
        "nodes": nodes,
        # per node that moved anything for the job (name -> bytes), from the server's counters:
        # up = update bodies it received, down = models and shards it sent
        "bytes_up_per_node": {t["name"]: t["bytes_up"] for t in traffic.values()},
        "bytes_down_per_node": {t["name"]: t["bytes_down"] for t in traffic.values()},
        **job_timing(job),
        "verified_contributions": sum(n["verified"] for n in nodes),
        "buyer_budget": str(costs.budget),
        "buyer_cost": str(costs.spent),
        "buyer_refund": str(costs.refunded),
        "redundancy_cost": str(costs.redundancy_cost),
        "provider_earnings_total": str(costs.provider_share),
        "platform_fee": str(costs.platform_fee),
        "quality_bonus": str(costs.bonus),
        "charges": costs.charges,
        "updates_counted_twice": doubles,
        "tasks_still_leased": Task.objects.filter(round__job=job, status="leased").count(),
        "ledger_balanced": ledger.ok,
        "ledger_problems": ledger.problems,
        "provenance_verified": verified,
        "model_hash": job.model_hash,
    }


def print_summary(s: dict[str, Any], write: Any = print) -> None:
    write("")
    write(f"job {s['job_id']}: {s['status']} after {s['rounds']} rounds in "
          f"{s['submit_to_end_s']:.1f} s from submission (the demo ran {s['wall_s']:.1f} s, "
          "start-up included)")  # fmt: skip
    acc = ", ".join(f"{a:.3f}" for a in s["accuracy_per_round"])
    write(f"accuracy per round: {acc}")
    write("")
    write(f"{'node':18} {'kind':9} {'network':7} {'speed':>5} {'tasks':>5} {'verified':>8} "
          f"{'rejected':>8} {'lost':>4} {'samples':>8} {'GPU s':>7} {'earned':>10}")  # fmt: skip
    for n in s["nodes"]:
        write(
            f"{n['name']:18} {n['kind']:9} {n['network_profile']:7} "
            f"{1 / n['compute_scale']:>5.2g} {n['tasks']:>5} {n['verified']:>8} "
            f"{n['rejected']:>8} {n['lost_leases']:>4} {n['samples']:>8} "
            f"{n['compute_s']:>7.1f} {n['earnings']:>10}"
        )
    write("")
    up, down = s["bytes_up_per_node"], s["bytes_down_per_node"]
    if up or down:
        n = max(len(up), len(down))
        write(
            f"traffic per node (mean of {n}): {sum(up.values()) / n / 1e3:.1f} kB up, "
            f"{sum(down.values()) / n / 1e3:.1f} kB down; compute utilization "
            + (f"{s['utilization']:.3f}" if s["utilization"] is not None else "—")
        )
    ran = sorted({pair for n in s["nodes"] for pair in n["ran_on"]})
    write(f"tasks trained on: {', '.join(ran) or 'nothing'}")
    if s.get("submit_to_first_lease_s") is not None:
        write(f"upload received to first task leased: {s['submit_to_first_lease_s']:.2f} s")
    write(f"verified contributions: {s['verified_contributions']}")
    write(
        f"buyer: budget {s['buyer_budget']}, cost {s['buyer_cost']} (of which redundancy "
        f"{s['redundancy_cost']}, quality bonus {s['quality_bonus']}), refund {s['buyer_refund']}"
    )
    write(
        f"providers earned {s['provider_earnings_total']}, platform fee {s['platform_fee']}; "
        f"ledger {'balanced' if s['ledger_balanced'] else 'NOT balanced: '}"
        + "; ".join(s["ledger_problems"])
    )
    write(f"provenance chain: {'verified' if s['provenance_verified'] else 'NOT verified'}")
    write(f"model: {s['model_path']} (sha256 of weights {s['model_hash'][:16]}…)")
