"""Network-aware training in the simulator: the adaptation policy sizes each node's work and
picks its codec; rounds close on a deadline and a quorum rather than on the slowest node.

Time is event-driven per node. A node sends its update when its planned steps are done; a
round closes by the marketplace's rules (trainer.round_lifecycle): on the plan's quorum, or
at the plan's deadline with what came. Updates that miss it are dropped or folded into the
next round with a staleness weight (FedBuff: 1/sqrt(1 + staleness)), as the spec says; far
nodes' two-round jobs are always folded in. Models reach nodes as the marketplace sends
them (trainer.delivery): round 1's is built from the seed, later ones come as the job's
delta chain from the version the node holds, or whole when that is smaller or the job sends
no deltas. With
`adaptation.overlap` a node keeps training while its update uploads and the next model
downloads, then merges: new weights = new global model + the progress made since its send
(Streaming DiLoCo's overlapped communication).

Fixed costs (`setup.costs`): every task pays `task_s` before its model download, so it delays
when the model arrives (with overlap a node trains on through it, as through the download);
every round pays `round_s` after it closes, before the next one opens.
"""

from __future__ import annotations

import itertools
import json
import math
import time

import torch

from trainer import round_lifecycle as rl
from trainer.adapt import NodePlan, PolicyState, RoundPlan, plan_round
from trainer.aggregation import ClientUpdate, build_strategy, health_weighted
from trainer.aggregation.functions import flatten_state
from trainer.compression import CodecConfig, decode_any, encode_update
from trainer.delivery import delivery_codec
from trainer.hashing import state_hash
from trainer.local import LocalResult, derive_seed, train_local
from trainer.lora import update_part
from trainer.provenance import ProvenanceChain
from trainer.rounds import close_round, staleness_weight
from trainer.schedule import round_lr
from trainer.sim.federated import ProgressFn, RunOptions, account_round
from trainer.sim.network import disconnects
from trainer.sim.nodes import InFlight, SimNode, State, computing_in, time_in
from trainer.sim.report import RoundLog, SimResult
from trainer.sim.setup import SimSetup
from trainer.updates import UpdateRejected, encode_state


class NetworkAwareRun:
    def __init__(self, setup: SimSetup, options: RunOptions | None = None) -> None:
        self.setup = setup
        self.spec = setup.spec
        self.cfg = setup.spec.adaptation
        self.options = options or RunOptions()
        self.strategy = build_strategy(self.spec.aggregation)
        self.global_state = dict(setup.initial_state)
        self.numel = sum(t.numel() for t in self.global_state.values())
        self.nodes = [
            SimNode(i, p, s, h)
            for i, (p, s, h) in enumerate(
                zip(setup.profiles, setup.shards, setup.shard_hashes, strict=True)
            )
        ]
        self.spec_payload = json.dumps(
            {"spec": self.spec.to_dict(), "model_hash": state_hash(self.global_state)}
        ).encode()
        self.version = 0
        self.delivery = delivery_codec(self.spec)
        self.residual: State | None = None  # what the last delta left out (trainer.delivery)
        self.delta_bytes: dict[int, int] = {}  # version -> size of the delta leading to it
        self._whole_bytes: int | None = None
        self.clock = 0.0
        self.policy = PolicyState()
        self.chain = ProvenanceChain(self.spec.name)
        target = self.spec.rounds.target
        self.result = SimResult(
            method="network_aware",
            network=setup.network,
            nodes=len(self.nodes),
            spec_name=self.spec.name,
            seed=setup.seed,
            target=target.value if target else None,
        )
        base = self.spec.local.batch_size
        flops = setup.train_flops_per_sample
        self.step_s = {n.node_id: n.profile.step_s(flops * base) for n in self.nodes}
        self.sample_s = {
            n.node_id: n.profile.step_s(flops * (base + 1)) - self.step_s[n.node_id]
            for n in self.nodes
        }

    def run(self, progress: ProgressFn | None = None) -> tuple[SimResult, State]:
        max_rounds = self.options.max_rounds or self.spec.rounds.max_rounds
        for node in self.nodes:  # everyone starts by fetching the initial model
            self.merge(node, start=0.0)
        for r in range(1, max_rounds + 1):
            if (self.result.reached_target and self.options.stop_at_target) or (
                self.result.stop_reason
            ):
                break
            log = self.round(r)
            account_round(
                self.result, log, self.spec.rounds.target, self.spec.rounds.early_stopping
            )
            if progress:
                progress(log)
        self.result.model_hash = state_hash(self.global_state)
        self.result.provenance_head = self.chain.head
        return self.result, self.global_state

    def round(self, r: int) -> RoundLog:
        measurements = [n.measurement(self.step_s[n.node_id]) for n in self.nodes]
        # a task's fixed cost delays its training unless overlap hides it under the previous
        # round's compute (every round but the first: send() keeps the node's progress)
        hidden = self.cfg.overlap and r > 1
        plan, self.policy = plan_round(
            self.spec, self.numel, measurements, self.policy, self.sample_s,
            task_s=0.0 if hidden else self.setup.costs.task_s,
        )  # fmt: skip
        start = self.clock
        for node in self.nodes:
            if node.job is None and plan.nodes[node.node_id].participate:
                self.send(node, plan.nodes[node.node_id], r)
        close = self.close_time(plan, start)
        received, dropped = self.collect(close)
        updates, rejected, stale = self.decode(received)

        closed = close_round(
            number=r, global_state=self.global_state, updates=self.weigh(updates, plan),
            strategy=self.strategy, model=self.setup.model, dataset=self.setup.dataset,
            chain=self.chain, target=self.spec.rounds.target, min_cosine=self.options.min_cosine,
            delivery=self.delivery, residual=self.residual,
        )  # fmt: skip
        self.residual = closed.residual
        new_state, ev = closed.state, closed.evaluation
        # agreement from the updates as sent: a low-health node's scaled-down delta must not
        # also lower the agreement its next health score is computed from
        self.measure_agreement([updates[i] for i in closed.kept], new_state)
        rejected += len(closed.dropped)
        self.global_state = new_state
        self.version += 1
        self.delta_bytes[self.version] = len(closed.delta) if closed.delta is not None else 0
        # verification, the aggregation queue, aggregation and opening the next round
        opened = close + self.setup.costs.round_s
        self.clock = opened
        bytes_down = 0
        delivered = {node.index for node, _ in received}
        for node in self.nodes:
            if node.job is None:  # delivered, dropped out or sat out: fetch the new model
                bytes_down += self.merge(node, opened, node.index in delivered)
        wall = opened - start
        computing = sum(computing_in(n, start, opened) for n in self.nodes)
        transferring = sum(time_in(n.transferring, start, opened) for n in self.nodes)
        return RoundLog(
            round=r,
            accuracy=ev.accuracy,
            correct=ev.correct,
            total=ev.total,
            loss=ev.loss,
            sim_time_s=opened,
            round_s=wall,
            compute_s=computing,
            idle_s=max(0.0, len(self.nodes) * wall - computing - transferring),
            bytes_up=sum(len(job.payload) for _, job in received),
            bytes_down=bytes_down,
            participants=len(closed.kept),
            dropped=len(dropped),
            rejected=rejected,
            stale=stale,
        )

    # ------------------------------------------------------------------ node side

    def send(self, node: SimNode, p: NodePlan, r: int) -> None:
        """Train the node's planned steps for real and put its update on the wire."""
        step = (
            self.step_s[node.node_id]
            + (p.batch_size - self.spec.local.batch_size) * (self.sample_s[node.node_id])
        )
        budget = p.steps * step
        if self.cfg.overlap:
            send_at = max(node.last_send + budget, node.merge_at + self.cfg.min_post_merge * budget)
            before_merge = max(0.0, node.merge_at - node.last_send)
        else:
            send_at = node.merge_at + budget
            before_merge = 0.0
        began = node.last_send if self.cfg.overlap else node.merge_at
        node.transfers += 1
        cut = disconnects(node.profile, self.setup.seed, r)
        if cut is not None:
            vanished = began + cut * (send_at - began)
            node.failed += 1
            node.computing.append((began, vanished))
            node.computing_since = None
            node.job = InFlight(node.version, vanished, None, b"", 0, 0.0, False)
            return
        steps_a = math.floor(before_merge / step)
        steps_b = max(1, round((send_at - max(node.merge_at, node.last_send)) / step))
        seed = derive_seed(self.setup.seed, r, node.index)
        started = time.perf_counter()
        progress = (
            self.train(node, node.local, steps_a, p.batch_size, seed, r).delta if steps_a else None
        )
        assert node.copy is not None
        merged = {k: node.copy[k] + (progress[k] if progress else 0) for k in node.copy}
        last = self.train(node, merged, steps_b, p.batch_size, seed + 1, r)
        self.result.host_compute_s += time.perf_counter() - started
        node.local = {k: merged[k] + last.delta[k] for k in merged}
        delta = {k: node.local[k] - node.copy[k] for k in merged}
        if node.index in self.options.adversarial:
            delta = {k: -self.options.attack_scale * v for k, v in delta.items()}
        comp = self.spec.compression
        codec = CodecConfig(p.codec, comp.block_size, comp.topk_fraction)
        payload = encode_update(delta, codec, node.feedback, {"node": node.node_id})
        arrival = send_at + node.profile.transfer_s(len(payload), upload=True)
        node.computing.append((began, send_at))
        node.computing_since = send_at if self.cfg.overlap else None
        if not self.cfg.overlap:
            node.transferring.append((send_at, arrival))
        samples = node.shard.num_train
        node.job = InFlight(
            node.version, send_at, arrival, payload, samples, last.loss, p.sync_every > 1
        )
        node.last_send = send_at

    def train(
        self, node: SimNode, start: State, steps: int, batch: int, seed: int, r: int
    ) -> LocalResult:
        return train_local(
            self.setup.model,
            start,
            node.shard,
            self.spec,
            seed=seed,
            steps=steps,
            batch_size=batch,
            proximal_mu=self.strategy.proximal_mu,
            lr=round_lr(self.spec, r),
        )

    def merge(self, node: SimNode, start: float, keep_progress: bool = False) -> int:
        """Send the node the global model, as marketplace.rounds.delivery would: round 1's it
        builds from the seed (it fetches only the spec and the hash to check), later ones come
        as the delta chain from the version it holds, or whole when that is smaller or the job
        sends no deltas. Every node then holds the canonical model exactly. A node that dropped
        out (or sat out) loses its local progress and restarts from the new model.
        """
        if node.copy is None:
            nbytes = len(self.spec_payload)
        else:
            whole = self.whole_bytes()
            chain = [self.delta_bytes[v] for v in range(node.version + 1, self.version + 1)]
            nbytes = sum(chain) if self.delivery is not None and sum(chain) < whole else whole
        node.copy = {k: v.clone() for k, v in self.global_state.items()}
        node.version = self.version
        # the node's next task pays its fixed cost before the download
        fetched = self.setup.costs.task_s + node.profile.transfer_s(nbytes, upload=False)
        node.merge_at = start + fetched
        fresh_start = not (keep_progress and self.cfg.overlap)
        if fresh_start:
            node.computing_since = None
            node.transferring.append((start, node.merge_at))
        if fresh_start:
            node.local = {k: v.clone() for k, v in node.copy.items()}
            node.last_send = node.merge_at
        return nbytes

    def whole_bytes(self) -> int:
        if self._whole_bytes is None:  # the model's size never changes
            self._whole_bytes = len(encode_state(self.global_state))
        return self._whole_bytes

    # ------------------------------------------------------------ coordinator side

    def close_time(self, plan: RoundPlan, start: float) -> float:
        """When the round closes, by the marketplace's rules (trainer.round_lifecycle) over
        its units as the updates arrive: on the plan's quorum, else at the plan's deadline
        with what came if the strategy can aggregate that many, else a deadline later, up
        to MAX_DEADLINES and past them while a node is still at work; then the run stops as the
        marketplace fails the job. A vanished
        node's unit never settles (the marketplace gives its lease back after
        FAILURE_DETECT_S; no other node here takes it up). A far node's two-round job not
        due yet is a far unit the round does not wait for."""
        rules = rl.Rules.for_spec(self.spec, plan_quorum=plan.quorum)
        # the round's units are the work it handed out (as the marketplace's are its tasks): a
        # job from an earlier round arriving late is folded in or dropped, but settles nothing
        jobs = [n.job for n in self.nodes if n.job]
        due = [j for j in jobs if j.version == self.version and self.is_due(j)]
        far = [rl.Unit(settled=False, usable=False, far=True)] * sum(
            not self.is_due(j) for j in jobs
        )
        arrivals = sorted(j.arrival for j in due if j.arrival is not None)

        def units(t: float) -> list[rl.Unit]:
            # a job that will arrive is in flight on a live node; a vanished node's never is
            return [
                rl.Unit(settled=j.arrival is not None and j.arrival <= t,
                        usable=j.arrival is not None and j.arrival <= t,
                        in_flight=j.arrival is not None and j.arrival > t)
                for j in due
            ] + far  # fmt: skip

        previous, deadline = start, start + plan.deadline_s
        # ends: past the last arrival nothing is in flight, and at_deadline then decides
        for passed in itertools.count(1):
            for t in (a for a in arrivals if previous < a <= deadline):
                if rl.quorum_reached(units(t), rules):
                    return t
            verdict = rl.at_deadline(units(deadline), rules, passed)
            if verdict is rl.Verdict.CLOSE:
                return deadline
            if verdict is rl.Verdict.GIVE_UP:
                usable = sum(u.usable for u in units(deadline))
                self.result.stop_reason = rl.gave_up_reason(self.version + 1, usable, rules)
                return deadline
            previous, deadline = deadline, deadline + rl.extension_s(plan.deadline_s)
        raise AssertionError("unreachable: itertools.count never ends")

    def is_due(self, job: InFlight) -> bool:
        """A far node's two-round job is due in the round after the one it started in."""
        return not job.two_rounds or job.version < self.version

    def collect(self, close: float) -> tuple[list[tuple[SimNode, InFlight]], list[InFlight]]:
        received, dropped = [], []
        for node in self.nodes:
            job = node.job
            if job is None:
                continue
            if job.arrival is None and self.is_due(job):
                dropped.append(job)
                node.job = None
            elif job.arrival is not None and job.arrival <= close:
                received.append((node, job))
                node.job = None
        return received, dropped

    def decode(self, received: list[tuple[SimNode, InFlight]]):
        updates: list[tuple[ClientUpdate, str]] = []
        rejected = stale = 0
        for node, job in received:
            staleness = self.version - job.version
            if staleness and not job.two_rounds and self.spec.rounds.late_updates == "drop":
                continue
            try:
                delta, _ = decode_any(
                    job.payload,
                    update_part(self.spec.model, self.global_state),
                    self.spec.aggregation.max_update_norm,
                )
            except UpdateRejected:
                node.rejected += 1
                rejected += 1
                continue
            node.updates += 1
            if staleness:
                stale += 1
                w = staleness_weight(staleness)
                delta = {k: v * w for k, v in delta.items()}
            update = ClientUpdate(node.node_id, delta, job.num_samples, {"loss": job.loss})
            updates.append((update, node.shard_hash))
        return updates, rejected, stale

    def weigh(
        self, updates: list[tuple[ClientUpdate, str]], plan: RoundPlan
    ) -> list[tuple[ClientUpdate, str]]:
        """With `aggregation.weighting: health`, weigh each update by the health score this
        round's plan gave its node (a node the plan did not score counts as healthy)."""
        if self.spec.aggregation.weighting != "health":
            return updates
        scores = {nid: p.health for nid, p in plan.nodes.items()}
        return health_weighted(updates, scores)[0]

    def measure_agreement(self, updates: list[tuple[ClientUpdate, str]], new: State) -> None:
        """Each contributor's cosine with the round's step: an input to its health score."""
        if not updates:
            return
        step = flatten_state({k: new[k] - self.global_state[k] for k in new})
        by_id = {n.node_id: n for n in self.nodes}
        for update, _ in updates:
            d = flatten_state(update.delta)
            by_id[update.node_id].agreement = torch.nn.functional.cosine_similarity(
                d, step, dim=0
            ).item()


def run_network_aware(
    setup: SimSetup, options: RunOptions | None = None, progress: ProgressFn | None = None
) -> tuple[SimResult, State]:
    return NetworkAwareRun(setup, options).run(progress)
