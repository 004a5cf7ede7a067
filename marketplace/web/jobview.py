"""What the job page shows, as plain data: rounds, per-node table, topology, cost, provenance.

The page renders `live_payload` once and then redraws it each time the server pushes a new one
(or it polls), so the first paint and the updates come from the same functions: every panel of
the page, provenance and node states included, changes without a reload.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import yaml
from django.urls import reverse

from desktop.money import amount
from marketplace.jobs import files
from marketplace.jobs.models import ACTIVE_STATUSES, Job
from marketplace.jobs.selectors import federated_status, node_states_of
from marketplace.ledger.selectors import job_costs
from marketplace.nodes.models import Node
from marketplace.nodes.selectors import network_of
from marketplace.rounds.models import Round
from marketplace.rounds.selectors import leased_nodes, node_work, rounds_of
from marketplace.rounds.sizing import measurement
from marketplace.sweeps.selectors import best_trial, trial_rows
from marketplace.web.labels import short_labels
from trainer.adapt import health
from trainer.spec import JobSpec, SpecError

# RTT bands for the topology's link colours (ms): a LAN, a good WAN, a far or poor one.
RTT_GOOD_MS = 50.0
RTT_FAIR_MS = 150.0


def round_rows(rounds: list[Round]) -> list[dict[str, Any]]:
    rows = []
    for r in rounds:
        m = r.metrics or {}
        span = (r.closed_at - r.opened_at).total_seconds() if r.closed_at else None
        rows.append(
            {
                "number": r.number,
                "status": r.status,
                "accuracy": m.get("accuracy"),
                "loss": m.get("loss"),
                "participants": m.get("participants"),
                "rejected": m.get("rejected"),
                "opened_at": r.opened_at.isoformat(),
                "seconds": None if span is None else round(span, 2),
            }
        )
    return rows


def rtt_band(rtt_ms: float | None) -> str:
    if rtt_ms is None:
        return "unknown"
    if rtt_ms <= RTT_GOOD_MS:
        return "good"
    if rtt_ms <= RTT_FAIR_MS:
        return "fair"
    return "poor"


def _spec(job: Job) -> JobSpec | None:
    try:
        return job.parsed_spec
    except SpecError:  # a job stored before a spec field was tightened: shown without it
        return None


def _health_scores(nodes: list[Node], spec: JobSpec | None) -> dict[int, float]:
    """The adaptation policy's health score per node, against the median node's speed."""
    if spec is None or not nodes:
        return {}
    ms = {n.pk: measurement(n, spec) for n in nodes}
    reference = statistics.median(m.step_s for m in ms.values())
    return {pk: round(health(m, reference).score, 3) for pk, m in ms.items()}


def node_rows(job: Job) -> list[dict[str, Any]]:
    work = {w["node_id"]: w for w in node_work(job)}
    ended = job.status not in ACTIVE_STATUSES
    working = set() if ended else leased_nodes(job)
    ids = set(work) | working
    nodes = list(Node.objects.filter(pk__in=ids).order_by("pk"))
    scores = _health_scores(nodes, _spec(job))
    total_samples = sum(w["samples"] or 0 for w in work.values()) or 1
    rows = []
    for node in nodes:
        w = work.get(node.pk, {})
        rtt = network_of(node).get("rtt_ms")
        rows.append(
            {
                "id": node.pk,
                "name": node.name,
                "kind": node.kind,
                "gpu": node.gpu_model or "CPU",
                "health": scores.get(node.pk),
                "rtt_ms": None if rtt is None else round(float(rtt), 1),
                "band": rtt_band(None if rtt is None else float(rtt)),
                "results": w.get("accepted", 0),
                "share": round((w.get("samples") or 0) / total_samples, 4),
                # on an ended job a node's own state (busy elsewhere, or gone) says nothing of
                # this job: what it did here is done
                "state": "done" if ended else "working" if node.pk in working else node.state,
                "reason": "" if ended or node.pk in working else node.state_reason,
                "isolation": (node.hardware or {}).get("isolation") or "unknown",
            }
        )
    return rows


def sandbox_note(job: Job, rows: list[dict[str, Any]]) -> str:
    """What confined this job's tasks: required full isolation, or which nodes had limits
    only (a Windows job object, a node without bubblewrap: no network or file isolation)."""
    if job.isolation_full:
        return ("Full isolation required: only nodes whose sandbox confines a task (no "
                "network, only the task's folder) run it.")  # fmt: skip
    limited = [r["name"] for r in rows if r["isolation"] != "full"]
    if not limited:
        return (
            "Every node on this job confines its tasks fully (no network, only the task's folder)."
        )
    return (f"Limits only on {len(limited)} of {len(rows)} nodes ({', '.join(limited[:5])}"
            f"{'…' if len(limited) > 5 else ''}): their sandbox caps memory and time but does "
            "not isolate the network or the file system. Require `isolation: full` in the "
            "spec's requirements to keep tasks off them.")  # fmt: skip


# characters of a node's name under its circle on the network map (10px text): more would run
# into the next node or off the map; the full name is its tooltip
TOPOLOGY_LABEL_CHARS = 12


def topology(rows: list[dict[str, Any]], size: int = 320) -> dict[str, Any]:
    """Server in the middle, nodes on a circle around it; positions in an SVG viewBox, and a
    label per node short enough to fit that still tells the nodes apart."""
    centre = size / 2
    radius = size / 2 - 36
    labels = short_labels([row["name"] for row in rows], TOPOLOGY_LABEL_CHARS)
    nodes = []
    for i, row in enumerate(rows):
        angle = 2 * math.pi * i / max(len(rows), 1) - math.pi / 2
        nodes.append(
            row
            | {
                "label": labels[i],
                "x": round(centre + radius * math.cos(angle), 1),
                "y": round(centre + radius * math.sin(angle), 1),
            }
        )
    return {"size": size, "centre": centre, "nodes": nodes}


def cost_summary(job: Job) -> dict[str, Any]:
    costs = job_costs(job)
    fields = ("budget", "held", "spent", "provider_share", "platform_fee", "bonus",
              "redundancy_cost", "refunded")  # fmt: skip
    summary: dict[str, Any] = {f: str(getattr(costs, f)) for f in fields}
    summary["fraction"] = float(costs.spent / costs.budget) if costs.budget else 0.0
    # as every surface shows money (desktop/money.py): small jobs cost fractions of a cent
    summary["shown"] = {f: amount(getattr(costs, f)) for f in fields}
    return {"available": True} | summary


def is_live(payload: dict[str, Any]) -> bool:
    """Whether a job's page may still change: a finished job's last payload is final."""
    return payload["status"] in ACTIVE_STATUSES


def live_payload(job: Job) -> dict[str, Any]:
    """Everything the job page updates while it is open: pushed on each change (its event
    stream), or polled where a stream cannot be held."""
    from marketplace.jobs.privacy import privacy_summary

    rows = node_rows(job)
    return {
        "status": job.status,
        "rounds_done": job.rounds_done,
        "max_rounds": job.max_rounds,
        "reached_target": job.reached_target,
        "has_model": bool(job.model_file),
        "model_url": reverse("web:job-model", args=[job.pk]),
        "rounds": round_rows(list(rounds_of(job))),
        "nodes": rows,
        "node_states": node_states_of(job),
        "federated": federated_status(job),
        "sandbox": sandbox_note(job, rows) if rows or job.isolation_full else "",
        "topology": topology(rows),
        "cost": cost_summary(job),
        "privacy": privacy_summary(job),
        "error": job.error,
        "stop_reason": job.stop_reason,
        "trials": sweep_trials(job),
        "provenance": provenance(job),
    }


def sweep_trials(job: Job) -> dict[str, Any] | None:
    """A sweep's trials table and best trial, for the page to redraw as trials move; None
    for other jobs."""
    if job.kind != "sweep":
        return None
    rows = [
        row | {"url": reverse("web:job", args=[row["job"]]) if row["job"] else ""}
        for row in trial_rows(job)
    ]
    best = best_trial(job)
    return {"rows": rows, "best": best.number if best else None}


# the provenance table shows the latest records only: a long job's payload, pushed on every
# change, stays small; the downloadable JSON holds them all
PROVENANCE_ROWS = 200


def provenance(job: Job) -> dict[str, Any]:
    """The provenance chain as stored, and whether it checks out (links and record hashes):
    part of the live payload, so the table grows as rounds close.

    Replaying every round from artifacts (`gpuflex` verify) is heavier; the page checks the
    chain itself, which detects any altered, missing or reordered record.
    """
    from trainer.provenance_chain import ProvenanceChain, ProvenanceError, verify_chain

    empty = {"records": [], "ok": None, "problems": [], "head": "", "count": 0, "url": ""}
    if not job.rounds_done or job.kind == "sweep":  # a sweep's rounds are its trials' own
        return empty
    try:
        chain = ProvenanceChain.from_json(files.get(files.provenance_name(job.pk)).decode())
    except (OSError, ProvenanceError, ValueError, KeyError) as exc:
        return empty | {"ok": False, "problems": [f"unreadable: {exc}"]}
    report = verify_chain(chain)
    records = [
        {
            "round": r.round,
            "strategy": r.strategy,
            "contributions": len(r.contributions),
            "input": r.input_model_hash[:12],
            "output": r.output_model_hash[:12],
            "hash": r.record_hash[:12],
            "accuracy": r.metrics.get("accuracy"),
        }
        for r in chain
    ]
    return {
        "records": records[-PROVENANCE_ROWS:],
        "count": len(records),
        "ok": report.ok,
        "problems": report.problems,
        "head": chain.head,
        "url": reverse("web:job-provenance", args=[job.pk]),
    }


def spec_yaml(job: Job) -> str:
    """The stored spec as the buyer wrote it: YAML, keys in the spec's own order."""
    return yaml.safe_dump(job.spec, sort_keys=False)
