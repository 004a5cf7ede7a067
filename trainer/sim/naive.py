"""The naive baseline: synchronous data parallel, full fp32 gradients all-reduced every step.

This is what DDP and Horovod do inside a datacenter. Every step each node computes a
gradient on a micro-batch of its own shard; the gradients are averaged by a ring all-reduce
and every replica takes the same optimizer step. Averaging equal-size micro-batch gradients
equals the gradient of their concatenation, so one backward pass over the concatenated
batch is the exact same arithmetic (up to float summation order) at a fraction of the cost.

Every node runs the whole job as one long task, so it pays the fixed per-task cost once, at
the start; there is no coordinator between "rounds", so no fixed per-round cost.
"""

from __future__ import annotations

import time

import torch

from trainer.evaluate import evaluate
from trainer.hashing import state_hash
from trainer.local import loss_fn, make_optimizer, planned_steps
from trainer.round_lifecycle import FAILURE_DETECT_S
from trainer.schedule import plateau_reason, round_lr
from trainer.sim.network import disconnects, ring_allreduce_s
from trainer.sim.report import RoundLog, SimResult
from trainer.sim.setup import SimSetup

# A collective that loses a member fails as a whole; elastic training (torchrun) then
# re-forms the group from the last step. Charged on top of noticing the loss.
RENDEZVOUS_S = 10.0


def run_naive_sync(
    setup: SimSetup, max_rounds: int | None = None, stop_at_target: bool = True, progress=None
) -> tuple[SimResult, dict[str, torch.Tensor]]:
    """Steps are grouped into 'rounds' of one local epoch's worth, for comparable logs."""
    spec = setup.spec
    model = setup.model
    model.load_state_dict(setup.initial_state)
    model.train()
    opt = make_optimizer([p for p in model.parameters()], spec.optimizer)
    batch = spec.local.batch_size
    grad_bytes = 4 * sum(p.numel() for p in model.parameters())
    comm_s = ring_allreduce_s(setup.profiles, grad_bytes)
    n = len(setup.profiles)
    per_node_bytes = 2 * (n - 1) * grad_bytes // n if n > 1 else 0
    step_s = [p.step_s(setup.train_flops_per_sample * batch) for p in setup.profiles]
    steps_per_round = max(planned_steps(spec, s.num_train, batch) for s in setup.shards)
    gens = [torch.Generator().manual_seed(setup.seed * 7919 + i) for i in range(n)]
    target = spec.rounds.target
    result = SimResult(
        method="naive_sync",
        network=setup.network,
        nodes=n,
        spec_name=spec.name,
        seed=setup.seed,
        target=target.value if target else None,
    )
    for r in range(1, (max_rounds or spec.rounds.max_rounds) + 1):
        for group in opt.param_groups:  # the same schedule over rounds as federated training
            group["lr"] = round_lr(spec, r)
        started = time.perf_counter()
        for _ in range(steps_per_round):
            xs, ys = [], []
            for shard, gen in zip(setup.shards, gens, strict=True):
                idx = torch.randint(shard.num_train, (min(batch, shard.num_train),), generator=gen)
                xs.append(shard.x_train[idx])
                ys.append(shard.y_train[idx])
            loss = loss_fn(model(torch.cat(xs)), torch.cat(ys), setup.dataset.task)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        result.host_compute_s += time.perf_counter() - started

        slowest = max(step_s)
        round_s = steps_per_round * (slowest + comm_s)
        if r == 1:
            round_s += setup.costs.task_s
        dropped = sum(disconnects(p, setup.seed, r) is not None for p in setup.profiles)
        if dropped:
            round_s += FAILURE_DETECT_S + RENDEZVOUS_S
        ev = evaluate(model, setup.dataset)
        log = RoundLog(
            round=r,
            accuracy=ev.accuracy,
            correct=ev.correct,
            total=ev.total,
            loss=ev.loss,
            sim_time_s=result.sim_wall_s + round_s,
            round_s=round_s,
            compute_s=steps_per_round * sum(step_s),
            idle_s=n * round_s - steps_per_round * sum(step_s),
            bytes_up=steps_per_round * per_node_bytes * n,
            bytes_down=steps_per_round * per_node_bytes * n,
            participants=n - dropped,
            dropped=dropped,
        )
        result.add_round(log)
        if target and ev.meets(target.metric, target.value):
            result.mark_target()
        if progress:
            progress(log)
        if spec.rounds.early_stopping is not None and not result.stop_reason:
            values = [getattr(entry, spec.rounds.early_stopping.metric) for entry in result.log]
            result.stop_reason = plateau_reason(values, spec.rounds.early_stopping)
        if (result.reached_target and stop_at_target) or result.stop_reason:
            break
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result.model_hash = state_hash(state)
    return result, state
