"""Round-based federated training over simulated nodes (FedAvg and the other strategies).

Each round every node downloads the global model, trains for real on its shard, and uploads
its update as safetensors bytes that go through the same validation as on the marketplace.
Only time is simulated: transfers by the network model, compute by the compute model, and
what the real system spends on every task and round besides them by `setup.costs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trainer.aggregation import build_strategy
from trainer.artifacts import ArtifactStore
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.evaluate import Evaluation
from trainer.hashing import bytes_hash, state_hash
from trainer.local import derive_seed, planned_steps, train_local
from trainer.lora import update_part
from trainer.privacy import epsilon_after, round_plan, rounds_within
from trainer.provenance import ProvenanceChain
from trainer.round_lifecycle import FAILURE_DETECT_S, quorum_units
from trainer.rounds import DEFAULT_MIN_COSINE, checkpoint_after, close_round
from trainer.schedule import plateau_reason, round_lr
from trainer.secagg.simulate import secure_mean
from trainer.sim.network import disconnects
from trainer.sim.report import RoundLog, SimResult
from trainer.sim.setup import SimSetup
from trainer.sim.zones import Upload, deliver_flat, deliver_zones
from trainer.spec import EarlyStoppingSpec, RoundsSpec, TargetSpec
from trainer.updates import UpdateRejected, decode_update, encode_state


@dataclass(frozen=True)
class NodeWork:
    steps: int
    batch_size: int


@dataclass(frozen=True)
class RunOptions:
    max_rounds: int | None = None
    stop_at_target: bool = True
    checkpoint: Path | None = None
    resume: bool = False
    provenance_dir: Path | None = None
    stop_after_round: int | None = None  # simulate an interruption (resume tests, demos)
    # Byzantine nodes for robustness experiments: they send -attack_scale x their honest update.
    adversarial: tuple[int, ...] = ()
    attack_scale: float = 10.0
    # the statistical filter of every round close (trainer.rounds); None measures the
    # aggregation strategies alone
    min_cosine: float | None = DEFAULT_MIN_COSINE
    # regional aggregation (trainer.sim.zones): 0 flat, else this many zones pre-aggregate
    zones: int = 0
    coordinator_in_mbps: float | None = None  # the coordinator's ingress link; None: unlimited


ProgressFn = Callable[[RoundLog], None]


def equal_work(setup: SimSetup) -> list[NodeWork]:
    """Plain FedAvg: the spec's local work on every node, whatever its speed."""
    batch = setup.spec.local.batch_size
    return [NodeWork(planned_steps(setup.spec, s.num_train, batch), batch) for s in setup.shards]


def run_federated(
    setup: SimSetup,
    options: RunOptions | None = None,
    progress: ProgressFn | None = None,
    method: str = "fedavg",
) -> tuple[SimResult, dict[str, torch.Tensor]]:
    options = options or RunOptions()
    spec = setup.spec
    strategy = build_strategy(spec.aggregation)
    global_state = dict(setup.initial_state)
    result = SimResult(
        method=method,
        network=setup.network,
        nodes=len(setup.profiles),
        spec_name=spec.name,
        seed=setup.seed,
        target=spec.rounds.target.value if spec.rounds.target else None,
    )
    chain = ProvenanceChain(spec.name)
    store = ArtifactStore(options.provenance_dir) if options.provenance_dir else None
    start_round = 1
    if options.resume and options.checkpoint and options.checkpoint.exists():
        start_round, global_state, chain = _restore(
            options.checkpoint, strategy, result, spec.rounds
        )

    work = equal_work(setup)
    max_rounds = options.max_rounds or spec.rounds.max_rounds
    privacy = spec.privacy
    if privacy.private and privacy.clip_norm is not None:
        plan = round_plan(spec, min(s.num_train for s in setup.shards))
        if privacy.epsilon is not None:  # stop before a round would exceed the budget
            max_rounds = min(max_rounds, rounds_within(plan, privacy.epsilon, privacy.delta,
                                                       max_rounds))  # fmt: skip
    for r in range(start_round, max_rounds + 1):
        if (result.reached_target and options.stop_at_target) or result.stop_reason:
            break
        log, closed = _round(setup, strategy, global_state, work, r, result, chain, store, options)
        global_state = closed.state
        account_round(result, log, spec.rounds.target, spec.rounds.early_stopping)
        if options.checkpoint:
            save_checkpoint(
                options.checkpoint,
                checkpoint_after(
                    closed, number=r, spec=spec.to_dict(), strategy=strategy, chain=chain,
                    history=[asdict(entry) for entry in result.log], seed=setup.seed,
                    host_compute_s=result.host_compute_s,
                ),
            )  # fmt: skip
        if progress:
            progress(log)
        if options.stop_after_round == r:
            break
    result.model_hash = state_hash(global_state)
    result.provenance_head = chain.head
    if privacy.private and privacy.clip_norm is not None:
        result.epsilon_spent = epsilon_after(plan, result.rounds, privacy.delta)
    return result, global_state


def account_round(
    result: SimResult,
    log: RoundLog,
    target: TargetSpec | None,
    early_stopping: EarlyStoppingSpec | None = None,
) -> None:
    """Add a round to the totals; shared by live rounds and rounds replayed from a checkpoint.
    A plateau (`rounds.early_stopping`) sets the result's `stop_reason`, ending the run."""
    result.add_round(log)
    if target and Evaluation(log.correct, log.total, log.loss).meets(target.metric, target.value):
        result.mark_target()
    if early_stopping is not None and not result.stop_reason:
        values = [getattr(entry, early_stopping.metric) for entry in result.log]
        result.stop_reason = plateau_reason(values, early_stopping)


def _close_on_quorum(
    quorum: float, units: int, updates: list, arrivals: list[float], finish: list[float]
) -> tuple[list, list[float]]:
    """As the marketplace closes a round (trainer.round_lifecycle): once `quorum` of the
    units' updates are in, not after every node, a failed one's detection included; updates
    arriving later are late and dropped. Flat uploads only: `updates[i]` arrived at
    `arrivals[i]`. Below the quorum the round waits for everything, as before."""
    need = quorum_units(quorum, units)
    if need >= units or len(arrivals) < need or need < 1:
        return updates, finish
    close_at = sorted(arrivals)[need - 1]
    kept = [u for u, at in zip(updates, arrivals, strict=True) if at <= close_at]
    return kept, [min(f, close_at) for f in finish]


def _round(setup, strategy, global_state, work, r, result, chain, store, options):
    spec = setup.spec
    model_bytes = len(encode_state(global_state))
    max_norm = spec.aggregation.max_update_norm
    uploads: list[Upload] = []
    finish: list[float] = []
    compute_s = bytes_up = bytes_down = 0.0
    dropped = rejected = 0
    task_s = setup.costs.task_s  # every node's task pays it once, before its download
    fails = setup.failures
    victims = fails.victims(len(setup.profiles), setup.seed, r) if fails else frozenset()
    for i, (profile, shard) in enumerate(zip(setup.profiles, setup.shards, strict=True)):
        w = work[i]
        t_down = profile.transfer_s(model_bytes, upload=False)
        bytes_down += model_bytes
        t_compute = w.steps * profile.step_s(setup.train_flops_per_sample * w.batch_size)
        # a failed node that comes back resumes its task from its journal: it starts over,
        # its update late by the work lost and its restart (trainer.sim.failures)
        redo = 0.0
        cut = disconnects(profile, setup.seed, r)
        if cut is None and i in victims:
            assert fails is not None
            if fails.back_after_s is None:
                cut = fails.at
            else:
                dropped += 1
                compute_s += fails.at * t_compute
                redo = task_s + t_down + fails.at * t_compute + fails.back_after_s
        if cut is not None:
            # The node vanished partway; the marketplace learns of it from missed heartbeats
            # (GPUFLEX_NODE_TIMEOUT_S, then the next tick: trainer.round_lifecycle).
            dropped += 1
            compute_s += cut * t_compute
            detect_s = fails.detect_s if fails and i in victims else FAILURE_DETECT_S
            finish.append(task_s + t_down + cut * t_compute + detect_s)
            continue
        started = time.perf_counter()
        local = train_local(
            setup.model,
            global_state,
            shard,
            spec,
            seed=derive_seed(setup.seed, r, i),
            steps=w.steps,
            batch_size=w.batch_size,
            proximal_mu=strategy.proximal_mu,
            lr=round_lr(spec, r),
        )
        result.host_compute_s += time.perf_counter() - started
        if i in options.adversarial:
            local.delta = {k: -options.attack_scale * v for k, v in local.delta.items()}
        payload = encode_state(local.delta, {"node": str(i), "round": str(r)})
        bytes_up += len(payload)
        compute_s += t_compute
        start_up = redo + task_s + t_down + t_compute
        try:
            delta, _ = decode_update(
                payload, update_part(setup.spec.model, global_state), max_norm=max_norm
            )
        except UpdateRejected:
            rejected += 1  # as on the marketplace: the round goes on without it
            finish.append(start_up + profile.transfer_s(len(payload), upload=True))
            continue
        uploads.append(Upload(i, start_up, payload, delta, local.num_samples,
                              setup.shard_hashes[i], {"loss": local.loss}))  # fmt: skip
    if options.zones:
        sent = deliver_zones(
            uploads, setup.profiles, options.zones, round_=r,
            reference=update_part(setup.spec.model, global_state), max_norm=max_norm,
            coordinator_in_mbps=options.coordinator_in_mbps,
        )  # fmt: skip
    else:
        sent = deliver_flat(uploads, setup.profiles, options.coordinator_in_mbps)
    updates = sent.updates
    finish += sent.arrivals
    secagg = spec.privacy.secure_aggregation
    if not options.zones and not secagg.enabled and spec.rounds.late_updates == "drop":
        updates, finish = _close_on_quorum(spec.rounds.quorum, len(setup.profiles), updates,
                                           sent.arrivals, finish)  # fmt: skip
    if secagg.enabled and updates:  # the server sees the masked sum's mean, nothing else
        label = bytes_hash("\n".join(sorted(lbl for _, lbl in updates)).encode())
        mean = secure_mean([u for u, _ in updates], secagg.clipping_range, secagg.threshold)
        updates = [(mean, label)]

    # the last update is in: the server verifies, aggregates and opens the next round
    round_s = max(finish) + setup.costs.round_s
    closed = close_round(
        number=r, global_state=global_state, updates=updates, strategy=strategy,
        model=setup.model, dataset=setup.dataset, chain=chain, store=store,
        target=spec.rounds.target, min_cosine=options.min_cosine,
    )  # fmt: skip
    ev = closed.evaluation
    log = RoundLog(
        round=r,
        accuracy=ev.accuracy,
        correct=ev.correct,
        total=ev.total,
        loss=ev.loss,
        sim_time_s=result.sim_wall_s + round_s,
        round_s=round_s,
        compute_s=compute_s,
        idle_s=sum(round_s - f for f in finish),
        bytes_up=int(bytes_up),
        bytes_down=int(bytes_down),
        bytes_in=sent.bytes_in,
        participants=len(closed.kept),
        dropped=dropped,
        rejected=rejected + len(closed.dropped),
    )
    return log, closed


def _restore(path, strategy, result, rounds: RoundsSpec):
    ckpt = load_checkpoint(path)
    strategy.load_state_dict(ckpt.strategy_state)
    for entry in ckpt.history:
        account_round(result, RoundLog(**entry), rounds.target, rounds.early_stopping)
    result.host_compute_s = float(ckpt.extra.get("host_compute_s", 0.0))
    chain = ProvenanceChain.from_json(ckpt.extra["provenance"])
    return ckpt.round + 1, dict(ckpt.model_state), chain
