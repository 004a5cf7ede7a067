"""How much work one node does on one task: the single switch point for the adaptation policy.

Plain jobs give every node the spec's equal work (what FedAvg does). Jobs whose spec enables
`adaptation` are sized by `trainer.adapt.plan_round`, the same pure function the simulator
uses: steps, batch and upload codec from each node's step time, its network as the agent
last measured it, and its verification record.

A node's step time is the job's work per sample over the node's one speed figure
(nodes.selectors.speed_of, ledger/speed.py: what its tasks show, its benchmark as the
prior): how fast a node is is that figure's alone, and what the job costs per sample is
the job's, measured from its recent results (each normalised by its node's figure), or
before it has any from the cohort's reference-model throughputs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings

from marketplace.jobs.model_headers import stored_numel
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node, NodeState
from marketplace.nodes.selectors import benchmark_of, network_of, speed_figure, speed_of
from marketplace.rounds.models import TaskResult
from trainer.adapt import NodeMeasurement, NodePlan, PolicyState, RoundPlan, Tier, plan_round
from trainer.sim.network import WARM_TASKS
from trainer.spec import JobSpec, ModelSpec

# Assumed until a node reports better: a slow home link and an overhead-bound small step.
DEFAULT_RTT_MS = 100.0
DEFAULT_MBPS = 20.0
DEFAULT_STEP_S = 2e-3
PEERS = 256  # the round's likely cohort the period is planned against
RECENT_RESULTS = 50  # the job's recent results its work per sample is taken from


@dataclass(frozen=True)
class Work:
    steps: int
    batch_size: int
    codec: str = "none"


def size_work(
    spec: JobSpec,
    node: Node,
    shard_size: int,
    *,
    input_shape: Sequence[int] = (),
    num_classes: int = 0,
    peers: Sequence[Node] | None = None,
    model_file: str = "",
) -> Work:
    """A node's work on a shard of `shard_size`. `model_file`: the round's stored model, whose
    header gives the planner the model's size without building it (the web process, which
    sizes a late-joining node's claim, imports no torch)."""
    from trainer.steps import planned_steps

    batch = spec.local.batch_size
    if not spec.adaptation.enabled or not input_shape:
        codec = spec.compression.codec if spec.compression.codec != "auto" else "none"
        return Work(steps=planned_steps(spec, shard_size, batch), batch_size=batch, codec=codec)
    return plan_works(spec, input_shape, num_classes, _with(node, peers), model_file)[node.pk]


def _plan(
    spec: JobSpec,
    input_shape: Sequence[int],
    num_classes: int,
    nodes: Sequence[Node],
    tiers: dict[str, str] | None = None,
    job: Job | None = None,
    model_file: str = "",
) -> tuple[RoundPlan, PolicyState]:
    if model_file:  # the stored model's header: no torch
        numel = stored_numel(model_file)
    else:  # the worker, opening a round: built from the spec (torch)
        numel = model_numel(spec.model.model_dump_json(), tuple(input_shape), num_classes)
    state = PolicyState(tiers={k: Tier(v) for k, v in (tiers or {}).items()})
    step_s = step_times(spec, nodes, job)
    # a task's fixed cost (lease, sandbox, imports) as the round-phase bench measured it: the
    # plan's deadline covers it, or rounds close before their updates can arrive
    measured = [measurement(n, spec, step_s.get(n.pk)) for n in nodes]
    return plan_round(spec, numel, measured, state, task_s=WARM_TASKS.task_s)


def _entry(p: NodePlan) -> dict[str, Any]:
    """A node's plan as Round.plan stores it (JSON)."""
    return {
        "participate": p.participate,
        "steps": p.steps,
        "batch_size": p.batch_size,
        "codec": p.codec,
        "tier": p.tier.value,
        "health": round(p.health, 4),
        "sync_every": p.sync_every,
    }


def plan_works(
    spec: JobSpec,
    input_shape: Sequence[int],
    num_classes: int,
    nodes: Sequence[Node],
    model_file: str = "",
) -> dict[object, Work]:
    """One policy plan for a cohort of nodes (not kept: see plan_cohort for a round's)."""
    plan, _ = _plan(spec, input_shape, num_classes, nodes, model_file=model_file)
    return {n.pk: planned_work(_entry(plan.nodes[str(n.pk)]), spec) for n in nodes}


def plan_key(node_id: object) -> str:
    # never a bare number: JSON key lookups read those as array indexes
    return f"n{node_id}"


def is_far(plan: dict[str, Any] | None, node_id: object) -> bool:
    """Whether a round's plan has the node sync every other round (trainer.adapt: its
    transfers take over `far_sync_factor` x the median's), so that its one task spans this
    round and the next. Plans made before far nodes were planned say nothing: every node
    synced each round."""
    entry = plan.get(plan_key(node_id)) if plan and node_id is not None else None
    if not isinstance(entry, dict) or not entry.get("participate"):
        return False
    return int(entry.get("sync_every") or 1) > 1


@dataclass(frozen=True)
class CohortPlan:
    """One round's plan as `open_round` keeps it: the nodes' entries (Round.plan), the
    policy's tiers after it (Job.policy_tiers), and the round's deadline (seconds) and
    quorum (updates) that trainer.round_lifecycle applies."""

    entries: dict[str, Any]
    tiers: dict[str, str]
    deadline_s: float
    quorum: int


def plan_cohort(job: Job, nodes: Sequence[Node]) -> CohortPlan:
    """One round's plan for the nodes online at its opening."""
    plan, state = _plan(job.parsed_spec, job.input_shape, job.num_classes, nodes,
                        job.policy_tiers, job)  # fmt: skip
    return CohortPlan(
        entries={plan_key(nid): _entry(p) for nid, p in plan.nodes.items()},
        tiers={nid: t.value for nid, t in state.tiers.items()},
        deadline_s=plan.deadline_s,
        quorum=plan.quorum,
    )


def planned_work(entry: dict[str, Any], spec: JobSpec) -> Work:
    """The work a plan gives a node; one it sits out gets the least (a round's plan never
    leases it a task at all)."""
    steps = entry["steps"] if entry["participate"] else spec.adaptation.min_local_steps
    return Work(steps=int(steps), batch_size=int(entry["batch_size"]), codec=str(entry["codec"]))


def figures(nodes: Sequence[Node]) -> dict[object, float]:
    """Each node's one speed figure (speed_of); a node with none (no benchmark, no task
    observed) counts as the cohort's median one, and a cohort with none at all as 1.0 each
    (only their ratios and the job's work per figure matter)."""
    known = {n.pk: f for n in nodes if (f := speed_of(n))}
    default = statistics.median(known.values()) if known else 1.0
    return {n.pk: known.get(n.pk, default) for n in nodes}


def step_times(spec: JobSpec, nodes: Sequence[Node], job: Job | None = None) -> dict[object, float]:
    """Seconds per step (at the spec's batch) for each node: the job's work per sample over
    the node's speed figure."""
    figs = figures(nodes)
    work = (job_work(job, figs) if job is not None else None) or prior_work(spec, nodes, figs)
    batch = spec.local.batch_size
    return {pk: max(work * batch / f, 1e-6) for pk, f in figs.items()}


def job_work(job: Job, figs: Mapping[object, float]) -> float | None:
    """The job's seconds per sample times the speed figure of the node that took them: the
    same for every node whatever its speed, the median over the job's last RECENT_RESULTS
    accepted results (one query); None before it has any."""
    default = statistics.median(figs.values()) if figs else 1.0
    rows = (
        TaskResult.objects.filter(
            task__round__job=job, accepted=True, compute_s__gt=0, task__steps__gt=0
        )
        .order_by("-created_at")
        .values_list("node_id", "compute_s", "task__steps", "task__batch_size", "metrics",
                     "node__speed_tflops", "node__benchmark")[:RECENT_RESULTS]
    )  # fmt: skip
    work = []
    for node_id, compute_s, leased, batch, metrics, stored, bench in rows:
        reported = metrics.get("steps") if isinstance(metrics, dict) else None
        # the steps it says it took (an overlapping node merges more), else those it was given
        steps = reported if isinstance(reported, int | float) and reported >= 1 else leased
        fig = figs.get(node_id) or speed_figure(stored, bench) or default
        work.append(compute_s / (steps * max(batch or 1, 1)) * fig)
    return statistics.median(work) if work else None


def prior_work(spec: JobSpec, nodes: Sequence[Node], figs: Mapping[object, float]) -> float:
    """Before the job has results: its work per sample from the cohort's benchmarks of the
    reference model nearest the job's (`train_samples_per_s`, what the agent measured the
    architecture at), each times its node's figure, the median; DEFAULT_STEP_S at the
    median figure when none has one."""
    work = []
    for n in nodes:
        per_sample = sample_seconds(benchmark_of(n), spec)
        if per_sample is not None:
            work.append(per_sample * figs[n.pk])
    if work:
        return statistics.median(work)
    median = statistics.median(figs.values()) if figs else 1.0
    return DEFAULT_STEP_S / spec.local.batch_size * median


def measurement(node: Node, spec: JobSpec, step_s: float | None = None) -> NodeMeasurement:
    """What the policy knows of a node: its measured link, its step time (`step_times` when
    given; else DEFAULT_STEP_S at the reference speed, over its speed figure: health scores
    compare step times, so only the figures' ratios count) and its record."""
    net = network_of(node)  # validated figures only: a bad stored one counts as unreported
    rtt_ms = float(net.get("rtt_ms") or DEFAULT_RTT_MS)
    reports = node.verified_ok + node.verified_bad
    return NodeMeasurement(
        node_id=str(node.pk),
        step_s=step_s if step_s is not None else default_step_s(node),
        rtt_s=max(rtt_ms, 0.1) / 1000,
        up_bps=float(net.get("up_mbps") or DEFAULT_MBPS) * 1e6,
        down_bps=float(net.get("down_mbps") or DEFAULT_MBPS) * 1e6,
        loss=min(max(float(net.get("loss") or 0.0), 0.0), 0.5),
        transfers=reports + node.lost_leases,
        failed_transfers=node.lost_leases,
        validation_failures=node.verified_bad,
        updates=reports,
        uptime=node.reliability,
    )


def default_step_s(node: Node) -> float:
    """DEFAULT_STEP_S on a node of the reference speed, scaled by the node's figure."""
    fig = speed_of(node)
    if not fig:
        return DEFAULT_STEP_S
    return DEFAULT_STEP_S * float(settings.GPUFLEX["REFERENCE_FP32_TFLOPS"]) / fig


def sample_seconds(benchmark: dict, spec: JobSpec) -> float | None:
    """Seconds per sample of the benchmark's reference model nearest the job's (None without
    one): a prior for the job's cost, never a node's speed (that is speed_of's)."""
    throughput = benchmark.get("train_samples_per_s")
    if isinstance(throughput, dict):
        ref = "transformer" if spec.model.arch == "transformer" else spec.model.arch
        throughput = throughput.get(ref) or throughput.get("mlp")
    try:
        value = 1.0 / float(throughput)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return value if value > 0 else None


@lru_cache(maxsize=128)
def model_numel(model_json: str, input_shape: tuple[int, ...], num_classes: int) -> int:
    from trainer.models import build_model

    model = build_model(ModelSpec.model_validate_json(model_json), input_shape, num_classes)
    return sum(t.numel() for t in model.state_dict().values())


def _with(node: Node, peers: Sequence[Node] | None) -> list[Node]:
    if peers is None:
        peers = list(
            Node.objects.exclude(state=NodeState.OFFLINE).order_by("-last_heartbeat_at")[:PEERS]
        )
    cohort = [p for p in peers if p.pk != node.pk]
    return [node, *cohort]
