"""The adaptation policy: per-node measurements in, per-node work, codec and participation out.

One pure function, `plan_round`, used unchanged by the simulator and the marketplace
scheduler. The idea (DiLoCo's, applied per node): a round costs each node its transfers plus
its local compute, so choose a round length where transfers are a small share of it, then
give every node as many local steps as fit, so all of them finish together. Nodes whose
transfers alone are far above the others' sync every other round instead of holding the
round back; slow links get a smaller codec before they get less work.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainer.adapt.health import NodeMeasurement, Tier, classify, health
from trainer.spec import JobSpec

# Codecs from most to least faithful; "auto" takes the first whose upload costs little
# next to the round trip it pays anyway.
CODEC_ORDER = ("none", "fp16", "int8", "int4", "topk")
PAYLOAD_RTT_SHARE = 0.25
HEADER_BYTES = 400
REDUCED_WORK = 0.5


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    tier: Tier
    health: float
    participate: bool
    steps: int
    batch_size: int
    codec: str  # for the node's upload
    download_codec: str  # the job's for the global model (trainer.delivery), "none": whole
    sync_every: int  # 1, or 2 for far nodes
    expected_s: float  # download + compute + upload


@dataclass(frozen=True)
class RoundPlan:
    round_s: float  # when every on-time participant should be done
    deadline_s: float  # when the round closes at the latest
    quorum: int  # updates that close a round before its deadline
    nodes: Mapping[str, NodePlan]


@dataclass(frozen=True)
class PolicyState:
    tiers: Mapping[str, Tier] = field(default_factory=dict)


def payload_bytes(codec: str, numel: int, block: int, topk_fraction: float) -> int:
    """Estimated size of an update of `numel` values in `codec` (see trainer.compression)."""
    blocks = math.ceil(numel / block)
    body = {
        "none": 4 * numel,
        "fp16": 2 * numel,
        "int8": numel + 4 * blocks,
        "int4": math.ceil(numel / 2) + 4 * blocks,
        "topk": 6 * max(1, math.ceil(topk_fraction * numel)),
    }[codec]
    return body + HEADER_BYTES


def transfer_s(m: NodeMeasurement, nbytes: int, upload: bool) -> float:
    return m.rtt_s + 8 * nbytes / m.effective_bps(upload)


def choose_codec(m: NodeMeasurement, numel: int, spec: JobSpec) -> str:
    comp = spec.compression
    if comp.codec != "auto":
        return comp.codec
    for codec in CODEC_ORDER:
        size = payload_bytes(codec, numel, comp.block_size, comp.topk_fraction)
        if 8 * size / m.effective_bps(upload=True) <= PAYLOAD_RTT_SHARE * m.rtt_s:
            return codec
    return CODEC_ORDER[-1]


def download_codec(spec: JobSpec) -> str:
    """How the job delivers the global model (trainer.delivery): a dense delta chain every
    node rebuilds bit for bit (top-k would starve nodes of most of the model), or whole."""
    from trainer.delivery_codec import delivery_codec_name

    return delivery_codec_name(spec)


def plan_round(
    spec: JobSpec,
    numel: int,
    measurements: Sequence[NodeMeasurement],
    state: PolicyState | None = None,
    sample_s: Mapping[str, float] | None = None,
    task_s: float = 0.0,
) -> tuple[RoundPlan, PolicyState]:
    """Plan one round. `sample_s` (optional) is each node's marginal seconds per extra sample
    in a step, so that larger batches are costed; without it steps cost the same at any batch.
    `task_s` is the fixed time a task waits before it trains (being woken, the sandbox, the
    imports) where nothing hides it: the deadline covers it, or a round whose every update
    pays it closes before any could arrive.
    """
    if not measurements:
        raise ValueError("plan_round needs at least one node")
    cfg = spec.adaptation
    state = state or PolicyState()
    sample_s = sample_s or {}
    ref_step = statistics.median(m.step_s for m in measurements)
    median_rtt = statistics.median(m.rtt_s for m in measurements)

    healths = {m.node_id: health(m, ref_step) for m in measurements}
    scores = {nid: h.score for nid, h in healths.items()}
    tiers = {nid: classify(h, state.tiers.get(nid)) for nid, h in healths.items()}
    active = [m for m in measurements if tiers[m.node_id] is not Tier.EXCLUDED]
    if not active:  # never stall a job: keep the healthiest node working
        best = max(measurements, key=lambda m: scores[m.node_id])
        tiers[best.node_id] = Tier.REDUCED
        active = [best]

    codecs = {m.node_id: choose_codec(m, numel, spec) for m in active}
    up = {m.node_id: transfer_s(m, _bytes(codecs[m.node_id], numel, spec), True) for m in active}
    comm = {
        m.node_id: up[m.node_id] + transfer_s(m, _bytes(download_codec(spec), numel, spec), False)
        for m in active
    }
    median_comm = statistics.median(comm.values())
    far = {nid for nid, c in comm.items() if c > cfg.far_sync_factor * median_comm}
    near = [m for m in active if m.node_id not in far] or active

    def step_time(m: NodeMeasurement, batch: int) -> float:
        return m.step_s + (batch - spec.local.batch_size) * sample_s.get(m.node_id, 0.0)

    batches = {
        m.node_id: _batch(spec.local.batch_size, m.rtt_s / median_rtt, cfg.max_batch_scale)
        for m in active
    }
    if cfg.overlap:
        # transfers run under compute: the period only has to cover the slowest near node's
        # send-to-merge path, with room left to train on the merged model
        round_s = max(comm[m.node_id] for m in near) / (1 - cfg.min_post_merge)
    else:
        round_s = statistics.fmean(comm[m.node_id] for m in near) / (1 - cfg.target_utilization)
    longest = max(
        comm[m.node_id] + cfg.max_local_steps * step_time(m, batches[m.node_id]) for m in near
    )
    shortest = max(
        comm[m.node_id] + cfg.min_local_steps * step_time(m, batches[m.node_id]) for m in near
    )
    round_s = max(shortest, min(round_s, longest))

    plans: dict[str, NodePlan] = {}
    for m in measurements:
        nid = m.node_id
        if nid not in codecs:
            plans[nid] = _idle(nid, tiers[nid], scores[nid], spec)
            continue
        sync_every = 2 if nid in far else 1
        window = sync_every * round_s - (0.0 if cfg.overlap else comm[nid])
        steps = math.floor(window / step_time(m, batches[nid]))
        if tiers[nid] is Tier.REDUCED:
            steps = math.floor(steps * REDUCED_WORK)
        steps = max(cfg.min_local_steps, min(cfg.max_local_steps, steps))
        plans[nid] = NodePlan(
            node_id=nid,
            tier=tiers[nid],
            health=scores[nid],
            participate=True,
            steps=steps,
            batch_size=batches[nid],
            codec=codecs[nid],
            download_codec=download_codec(spec),
            sync_every=sync_every,
            # with overlap the download hides under the previous period's compute
            expected_s=(up[nid] if cfg.overlap else comm[nid]) + steps * step_time(m, batches[nid]),
        )
    on_time = [p for p in plans.values() if p.participate and p.sync_every == 1]
    expected = max(p.expected_s for p in on_time) if on_time else round_s
    # the slack is for what varies (transfers, steps); the fixed cost is added as it is
    deadline = expected * (1 + cfg.deadline_slack) + task_s
    expected += task_s
    if spec.rounds.deadline_s is not None:
        deadline = min(deadline, spec.rounds.deadline_s)
    quorum = max(1, math.ceil(spec.rounds.quorum * max(1, len(on_time))))
    plan = RoundPlan(round_s=expected, deadline_s=deadline, quorum=quorum, nodes=plans)
    return plan, PolicyState(tiers=tiers)


def _bytes(codec: str, numel: int, spec: JobSpec) -> int:
    comp = spec.compression
    return payload_bytes(codec, numel, comp.block_size, comp.topk_fraction)


def _batch(base: int, latency_ratio: float, max_scale: float) -> int:
    """Higher latency, larger batches: amortize each exchange over more samples."""
    return max(1, round(base * min(max_scale, max(1.0, latency_ratio))))


def _idle(nid: str, t: Tier, score: float, spec: JobSpec) -> NodePlan:
    return NodePlan(
        node_id=nid,
        tier=t,
        health=score,
        participate=False,
        steps=0,
        batch_size=spec.local.batch_size,
        codec="none",
        download_codec="none",
        sync_every=1,
        expected_s=0.0,
    )
