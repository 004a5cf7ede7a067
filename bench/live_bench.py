"""The real system measured as the simulator is: the marketplace, a Celery worker and five
agent processes, each behind its simulated wan transport, train the digits MLP to 0.95 in two
modes, and the server's own counters say what it cost.

    python -m bench.live_bench --mode plain|aware       one run, JSON on stdout
    python -m bench.live_bench --mode aware --sim-only  only the simulator's prediction
    python -m bench.run --only live                     both, with the table

`plain` is plain FedAvg: fp32 updates (codec none), the spec's equal local work on every node,
no adaptation, every update awaited (quorum 1.0). `aware` is `gpuflex demo`'s network-aware
job: the adaptation policy sizes each node's work and picks its upload codec, a round closes
on 4 of 5 updates, and agents keep training while their updates upload and the next task's
inputs arrive, merging that progress into their next task (`adaptation.overlap`, as the
simulator models it). Models reach nodes the same way in both (trainer.delivery):
plain FedAvg downloads each round's model whole; the network-aware job builds round 1's from
the seed and fetches later ones as int8 deltas against the version the node holds. The real
agents also download their shards (once per node and shard: their input cache keeps them and
claims prefer shards a node holds), which the simulator's nodes hold from the start, so bytes
down compare only in part.

Figures, each from the server's side:
- time to 0.95: round 1 opening to the end of the round that reached 0.95 (its aggregation
  done and the job finished), as the simulator's `time_to_target_s` runs from 0 to the end of
  that round (its fixed round cost included);
- bytes up / down per node: NodeTraffic, the payload bytes the agent endpoints received
  (update bodies) and sent (models, shards);
- utilization: compute seconds the nodes reported on their accepted uploads over
  (nodes x wall time), the simulator's definition (SimResult.utilization).

All five agents are platform nodes, so the marketplace replicates none of their tasks
(verification replicas would be work the simulator does not model). The simulator's
prediction runs the same spec on five simulated nodes with the agents' own links: an agent's
transport draws node `sha256(name) % 8` of eight wan nodes at seed 0 (desktop/agent.py), the
simulator's node i at seed 0 is the same draw. No time scale: the transports sleep real time
(`network_time_scale` 1.0), which keeps a run to a few minutes on the digits MLP.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

MODES = ("plain", "aware")  # what `--only live` compares
# `naive` (bench.promises_bench): `rounds.mode: naive`, naive synchronous training on the
# marketplace: one local step a round on every shard, nothing compressed
ALL_MODES = (*MODES, "naive")
NAIVE_MAX_ROUNDS = 2000  # one step each: the run's timeout ends it first
NAMES = ("wan-a", "wan-b", "wan-c", "wan-d", "wan-e")
NETWORK = "wan"
TARGET = 0.95
MAX_ROUNDS = 60
TIMEOUT_S = 900.0  # per run: a mode that has not reached 0.95 by then is reported as such
DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo-digits.yaml"
# the goals (digits MLP, 5 agents, wan)
GOAL_TIME_RATIO = 0.5  # network-aware time to 0.95 <= 0.5 of plain FedAvg's
GOAL_BYTES_RATIO = 50.0  # bytes up + down per node >= 50x fewer
GOAL_SIM_FACTOR = 2.0  # the simulator's predicted time within 2x of the measured one


def spec_for(mode: str) -> dict[str, Any]:
    """The job spec a mode submits (and the simulator runs)."""
    from trainer.sim.compare import plain_variant
    from trainer.spec import parse_spec

    raw = yaml.safe_load(DEMO_SPEC.read_text(encoding="utf-8"))
    raw["name"] = f"live-{mode}"
    raw["rounds"]["max_rounds"] = MAX_ROUNDS
    raw["rounds"]["target"] = {"metric": "accuracy", "value": TARGET}
    spec = parse_spec(raw)
    if mode == "plain":
        return plain_variant(spec).to_dict()
    if mode == "aware":
        # the demo's job as it is: sized work and codecs, quorum rounds, overlap on
        return spec.to_dict()
    if mode == "naive":
        for section in ("local", "compression", "adaptation"):
            raw.pop(section, None)
        raw["rounds"] = {"mode": "naive", "max_rounds": NAIVE_MAX_ROUNDS,
                         "target": raw["rounds"]["target"]}  # fmt: skip
        return parse_spec(raw).to_dict()
    raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def agent_profiles(names: tuple[str, ...] = NAMES) -> list[Any]:
    """The links the agents' simulated transports draw (desktop.client.simulated_link of
    SimulatedNetwork's eight nodes, seed 0)."""
    from desktop.client import simulated_link
    from trainer.sim.network import get_profile

    profile = get_profile(NETWORK)
    return [profile.node(simulated_link(n), 8, 0) for n in names]


def predict(mode: str) -> dict[str, Any]:
    """The simulator on the same spec, five nodes with the agents' links, its default fixed
    costs (warm task workers, as the agents run)."""
    import torch

    from trainer.sim.adaptive import run_network_aware
    from trainer.sim.federated import run_federated
    from trainer.sim.network import WARM_TASKS
    from trainer.sim.setup import prepare
    from trainer.spec import parse_spec

    torch.set_num_threads(1)
    spec = parse_spec(spec_for(mode))
    setup = prepare(spec, len(NAMES), NETWORK, spec.seed, costs=WARM_TASKS)
    setup.profiles = agent_profiles()
    started = time.perf_counter()
    if spec.adaptation.enabled:
        result, _ = run_network_aware(setup)
    else:
        result, _ = run_federated(setup)
    n = result.nodes
    return {
        "time_to_target_s": result.time_to_target_s,
        "rounds_to_target": result.rounds_to_target,
        "reached_target": result.reached_target,
        "final_accuracy": result.final_accuracy,
        "bytes_up_per_node": result.bytes_up / n,
        "bytes_down_per_node": result.bytes_down / n,
        "utilization": result.utilization,
        "fixed_costs": {"task_s": setup.costs.task_s, "round_s": setup.costs.round_s},
        "host_s": round(time.perf_counter() - started, 1),
    }


def _mean(values: dict[str, int]) -> float | None:
    return sum(values.values()) / len(values) if values else None


def measure(mode: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """One real run through `gpuflex demo`'s machinery; figures from its summary, which reads
    the server's database and counters."""
    os.environ.setdefault("GPUFLEX_WARM_TASKS", "1")
    from marketplace.demo.cluster import NodePlan
    from marketplace.demo.run import Options
    from marketplace.demo.run import run as run_demo

    nodes = tuple(NodePlan(n, kind="platform", profile=NETWORK, price="3.00") for n in NAMES)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuflex-live-") as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump(spec_for(mode)))
        try:
            s = run_demo(Options(data_dir=Path(tmp) / "demo", spec=spec, nodes=nodes,
                                 quiet=True, target=TARGET, budget="20.00",
                                 timeout_s=timeout_s))  # fmt: skip
            work = _work(s["job_id"])
        except Exception as exc:  # a run that broke is reported, not a crash of the bench
            return {"error": f"{type(exc).__name__}: {exc}"[:500],
                    "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
    up, down = s["bytes_up_per_node"], s["bytes_down_per_node"]
    return {
        "status": s["status"],
        "reached_target": s["reached_target"],
        "time_to_target_s": s["time_to_target_s"],
        "rounds": s["rounds"],
        "final_accuracy": s["final_accuracy"],
        "job_wall_s": s["job_wall_s"],
        "utilization": s["utilization"],
        "bytes_up_per_node": up,
        "bytes_down_per_node": down,
        "mean_bytes_up_per_node": _mean(up),
        "mean_bytes_down_per_node": _mean(down),
        "round_seconds": s["round_seconds"],
        "accuracy_per_round": s["accuracy_per_round"],
        **work,
        "wall_s": s["wall_s"],
    }


def _work(job_id: str) -> dict[str, Any]:
    """What the marketplace sized: codecs and local steps of the job's leased tasks."""
    from collections import Counter

    from marketplace.rounds.models import Task

    rows = list(
        Task.objects.filter(round__job_id=job_id, steps__isnull=False).values_list("codec", "steps")
    )
    steps = sorted(s for _, s in rows)
    return {
        "tasks": len(rows),
        "codecs": dict(Counter(c for c, _ in rows)),
        "median_steps": steps[len(steps) // 2] if steps else None,
    }


def run(mode: str, sim_only: bool = False, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": mode, "spec": spec_for(mode)}
    if not sim_only:
        out["measured"] = measure(mode, timeout_s)
    out["predicted"] = predict(mode)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.live_bench")
    parser.add_argument("--mode", choices=ALL_MODES, required=True)
    parser.add_argument("--sim-only", action="store_true", help="the simulator's prediction")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S, help="the real run's")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.mode, args.sim_only, args.timeout_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
