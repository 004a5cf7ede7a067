"""Scaling on a compute-bound workload (issue #13): the byte transformer on Python source.

Training is real (this CPU, real gradients, a real validation loss); only time is simulated,
with the simulator's time model (trainer/sim/network.py). Two figures:

- strong scaling: N wan nodes share one fixed global batch per step (each trains on its 1/N
  of it: GLOBAL_BATCH / N sequences), network-aware rounds, warm fixed costs; time to a
  validation loss against N, speedup and efficiency against one node;
- against a centralized cluster with the same total compute: one node N times as fast, no
  network and no fixed costs, taking synchronous steps on the whole global batch (what
  synchronous data parallel on N GPUs with a free interconnect computes).

Compute-bound: every step is charged `compute_scale` times the byte transformer's FLOPs, so
that one nominal node (speed 1.0, 10 TFLOP/s) takes GLOBAL_STEP_S for the global batch's step.
The dynamics are the small model's own; the clock is that of a model with that much more
compute per sample. The bytes on the wire stay the small model's.

The local optimizer is plain SGD: it keeps no state, so the average of N nodes' local steps on
1/N of the batch is (to first order) one step on the whole batch, the same optimization as the
centralized run. train_local starts a fresh optimizer for every task, so Adam's moments would
restart every round, and each node would normalize its own small-batch gradient: with AdamW
the same runs scale far worse (docs/architecture.md, "Scaling").

    python -m bench.run --only scaling        # a few minutes on 2 cores
    python -m bench.scaling_bench --step-s 2  # the same at another compute scale, as JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.sim.adaptive import run_network_aware
from trainer.sim.compare import network_aware_variant
from trainer.sim.naive import run_naive_sync
from trainer.sim.network import EFFECTIVE_FLOPS, NO_FIXED_COSTS, STEP_OVERHEAD_S, WARM_TASKS
from trainer.sim.report import SimResult
from trainer.sim.setup import SimSetup, prepare
from trainer.spec import JobSpec, parse_spec

STDLIB_MODULES = ("argparse.py", "inspect.py", "typing.py", "dataclasses.py", "functools.py")
TEXT_BYTES = 256 * 1024
SEQ_LEN = 64
MODEL = {"arch": "transformer", "d_model": 64, "n_layers": 2, "n_heads": 4}
OPTIMIZER = {"name": "sgd", "lr": 0.3}
GLOBAL_BATCH = 100  # sequences per synchronous step, split evenly over the nodes
TARGET_LOSS = 2.6  # validation cross-entropy in nats per byte (unigram: 3.05, bigram: ~2.3)
GLOBAL_STEP_S = 10.0  # the global batch's step on one nominal node
EVAL_EVERY = 2  # the centralized run's steps between evaluations
MAX_ROUNDS = 400
NETWORK = "wan"
NODE_COUNTS = (1, 2, 5, 10, 20, 50)


# ------------------------------------------------------------------------------ the job


def stdlib_corpus(folder: Path) -> Path:
    """A fixed set of standard-library modules: offline, real code, the same on any host of
    one Python version (bench/replica_divergence.py trains on the same)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join((root / name).read_bytes() for name in STDLIB_MODULES)[:TEXT_BYTES]
    path = folder / "stdlib.txt"
    path.write_bytes(text[: text.rfind(b"\n") + 1])
    return path


def job_spec(corpus: Path, batch: int, **overrides: Any) -> JobSpec:
    """The job: `batch` sequences per step on each node; `overrides` replace whole sections."""
    data = {
        "name": "stdlib-bytes-scaling",
        "seed": 0,
        "dataset": {"kind": "text", "path": str(corpus), "seq_len": SEQ_LEN, "test_fraction": 0.1},
        "model": MODEL,
        "optimizer": OPTIMIZER,
        # network-aware rounds size the work themselves; naive sync evaluates every `steps`
        "local": {"steps": EVAL_EVERY, "batch_size": batch},
        "rounds": {"max_rounds": MAX_ROUNDS, "target": {"metric": "loss", "value": TARGET_LOSS}},
        "aggregation": {"strategy": "fedavg"},
        "sharding": {"method": "random"},
    }
    return parse_spec(data | overrides)


def node_batch(nodes: int, global_batch: int = GLOBAL_BATCH) -> int:
    """Each node's share of the global batch (at least one sequence)."""
    if nodes < 1:
        raise ValueError("at least one node")
    return max(1, round(global_batch / nodes))


def compute_scale(train_flops_per_sample: float, global_batch: int, step_s: float) -> float:
    """The factor on a step's FLOPs that makes one nominal node take `step_s` seconds for the
    global batch's step (the time model: STEP_OVERHEAD_S + FLOPs / EFFECTIVE_FLOPS)."""
    if step_s <= STEP_OVERHEAD_S:
        raise ValueError(f"a step takes more than the fixed {STEP_OVERHEAD_S} s")
    return (step_s - STEP_OVERHEAD_S) * EFFECTIVE_FLOPS / (train_flops_per_sample * global_batch)


def charge_compute(setup: SimSetup, global_batch: int, step_s: float) -> float:
    """Make the simulator charge every step `compute_scale` times its FLOPs; returns the scale."""
    scale = compute_scale(setup.train_flops_per_sample, global_batch, step_s)
    info = setup.info
    setup.info = dataclasses.replace(info, flops_per_sample=info.flops_per_sample * scale)
    return scale


# --------------------------------------------------------------------------------- runs


def network_aware_run(
    spec: JobSpec,
    nodes: int,
    network: str = NETWORK,
    global_batch: int = GLOBAL_BATCH,
    step_s: float = GLOBAL_STEP_S,
) -> SimResult:
    """What `gpuflex-sim compare` runs as network_aware (trainer.sim.compare.run_method), with
    the compute charged as above."""
    aware = network_aware_variant(spec).replace(sharding={"method": "capability"})
    setup = prepare(aware, nodes, network, aware.seed, costs=WARM_TASKS)
    charge_compute(setup, global_batch, step_s)
    result, _ = run_network_aware(setup)
    return result


def centralized_run(
    spec: JobSpec,
    speed: float = 1.0,
    global_batch: int = GLOBAL_BATCH,
    step_s: float = GLOBAL_STEP_S,
) -> SimResult:
    """One node `speed` times as fast as a nominal one, the whole dataset, one persistent
    optimizer, synchronous steps on `spec.local.batch_size` sequences, no network (naive sync
    on one node never communicates) and no fixed costs."""
    setup = prepare(spec, 1, "lan", spec.seed, costs=NO_FIXED_COSTS)
    charge_compute(setup, global_batch, step_s)
    setup.profiles = [dataclasses.replace(p, speed=speed) for p in setup.profiles]
    result, _ = run_naive_sync(setup)
    return result


# ------------------------------------------------------------------------------ figures


def speedups(times: dict[int, float | None]) -> dict[int, dict[str, float | None]]:
    """Speedup over the fewest nodes' time, and efficiency: speedup / (nodes / fewest)."""
    base_nodes = min(times)
    base = times[base_nodes]
    out: dict[int, dict[str, float | None]] = {}
    for nodes, t in sorted(times.items()):
        speedup = base / t if base and t else None
        efficiency = speedup * base_nodes / nodes if speedup else None
        out[nodes] = {"speedup": speedup, "efficiency": efficiency}
    return out


def central_fraction(central_s: float | None, aware_s: float | None) -> float | None:
    """The share of a centralized cluster's speed reached: its time over ours (1 = as fast)."""
    return central_s / aware_s if central_s and aware_s else None


def _summary(result: SimResult) -> dict[str, Any]:
    rounds = result.rounds_to_target or result.rounds
    return {
        "time_to_target_s": result.time_to_target_s,
        "rounds_to_target": result.rounds_to_target,
        "reached_target": result.reached_target,
        "utilization": result.utilization,
        "mean_round_s": result.sim_wall_s / result.rounds if result.rounds else None,
        "loss_at_target": result.log[rounds - 1].loss if result.log else None,
        "curve": {
            "sim_time_s": [log.sim_time_s for log in result.log],
            "loss": [log.loss for log in result.log],
        },
    }


def measure(
    node_counts: Sequence[int] = NODE_COUNTS, step_s: float = GLOBAL_STEP_S
) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = stdlib_corpus(Path(tmp))
        probe = prepare(job_spec(corpus, GLOBAL_BATCH), 1, "lan", 0)
        setup = {
            "corpus": f"{len(STDLIB_MODULES)} standard-library modules "
            f"({', '.join(STDLIB_MODULES)}), {corpus.stat().st_size:,} bytes",
            "train_sequences": probe.dataset.num_train,
            "test_sequences": probe.dataset.num_test,
            "seq_len": SEQ_LEN,
            "model": MODEL,
            "parameters": probe.info.parameters,
            "train_flops_per_sample": probe.train_flops_per_sample,
            "optimizer": OPTIMIZER,
            "global_batch": GLOBAL_BATCH,
            "target_loss": TARGET_LOSS,
            "global_step_s": step_s,
            "compute_scale": compute_scale(probe.train_flops_per_sample, GLOBAL_BATCH, step_s),
            "network": NETWORK,
            "fixed_costs": dataclasses.asdict(WARM_TASKS),
            "eval_every_central": EVAL_EVERY,
        }

        aware: dict[int, dict[str, Any]] = {}
        for n in node_counts:
            t = time.perf_counter()
            result = network_aware_run(job_spec(corpus, node_batch(n)), n, step_s=step_s)
            aware[n] = {"nodes": n, "node_batch": node_batch(n), **_summary(result)}
            aware[n]["host_s"] = time.perf_counter() - t
            print(
                f"  network-aware, {n} {NETWORK} nodes: {_fmt(result.time_to_target_s)} s to "
                f"loss {TARGET_LOSS} in {result.rounds_to_target} rounds "
                f"(utilization {result.utilization:.3f}; {aware[n]['host_s']:.0f} s here)",
                flush=True,
            )

        # One node N times as fast: every simulated second of a run is divided by N (no
        # network, no fixed costs), so one real run per global batch gives every N's time.
        central: dict[int, dict[str, Any]] = {}
        for batch in sorted({n * node_batch(n) for n in node_counts}):
            t = time.perf_counter()
            result = centralized_run(job_spec(corpus, batch), 1.0, step_s=step_s)
            run = {"global_batch": batch, **_summary(result), "host_s": time.perf_counter() - t}
            print(
                f"  centralized, global batch {batch}, speed 1: "
                f"{_fmt(result.time_to_target_s)} s to loss {TARGET_LOSS}",
                flush=True,
            )
            for n in node_counts:
                if n * node_batch(n) == batch:
                    t1 = result.time_to_target_s
                    central[n] = {"nodes": n, "speed": n, "run": batch}
                    central[n]["time_to_target_s"] = t1 / n if t1 is not None else None
            setup.setdefault("centralized_runs", []).append(run)

    times = {n: row["time_to_target_s"] for n, row in aware.items()}
    for n, row in speedups(times).items():
        aware[n].update(row)
    for n, row in central.items():
        row["network_aware_s"] = aware[n]["time_to_target_s"]
        row["fraction"] = central_fraction(row["time_to_target_s"], row["network_aware_s"])
    return {
        "setup": setup,
        "network_aware": [aware[n] for n in sorted(aware)],
        "centralized": [central[n] for n in sorted(central)],
        "bench_s": time.perf_counter() - started,
    }


def _fmt(value: float | None, fmt: str = ".1f") -> str:
    return "—" if value is None else format(value, fmt)


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


# ------------------------------------------------------------------- chart and markdown


def chart(data: dict[str, Any], path: Path) -> None:
    """Speedup against nodes (log-log, with the ideal line), and loss against time per N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aware = data["network_aware"]
    central = {row["nodes"]: row for row in data["centralized"]}
    base = aware[0]["time_to_target_s"]
    nan = float("nan")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120)
    nodes = [r["nodes"] for r in aware]
    ax.plot(nodes, [n / nodes[0] for n in nodes], color="grey", linestyle="--", label="ideal")
    ax.plot(
        nodes,
        [r["speedup"] or nan for r in aware],
        marker="o",
        label=f"GPUFlex network-aware, {NETWORK}",
    )
    ax.plot(
        sorted(central),
        [
            base / central[n]["time_to_target_s"]
            if base and central[n]["time_to_target_s"]
            else nan
            for n in sorted(central)
        ],
        marker="s",
        linestyle=":",
        label="centralized: one node N× as fast",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_yticks(nodes, [str(n) for n in nodes])
    ax.minorticks_off()
    ax.set_xlabel("nodes")
    ax.set_ylabel(f"speedup to loss {data['setup']['target_loss']} (vs {nodes[0]} node)")
    ax.set_title("strong scaling, fixed global batch")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    for row in aware:
        curve = row["curve"]
        ax2.plot(curve["sim_time_s"], curve["loss"], label=f"{row['nodes']} nodes")
    ax2.axhline(data["setup"]["target_loss"], color="grey", linestyle="--", linewidth=0.8)
    ax2.set_xscale("log")
    ax2.set_ylim(top=4.0)
    ax2.set_xlabel("simulated wall-clock time (s, log scale)")
    ax2.set_ylabel("validation loss (nats per byte)")
    ax2.set_title("network-aware on wan")
    ax2.legend(loc="upper right", fontsize="small")
    ax2.grid(alpha=0.3)
    fig.suptitle("byte transformer on Python source, simulator")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(data: dict[str, Any]) -> list[str]:
    s = data["setup"]
    aware = data["network_aware"]
    model = s["model"]
    opt = s["optimizer"]
    central = data["centralized"]
    ten = next((r for r in aware if r["nodes"] == 10), None)
    fifty = next((r for r in aware if r["nodes"] == 50), None)
    lines = [
        "## Scaling on a compute-bound workload (byte transformer, simulator)",
        "",
        f"Byte-level transformer (d_model {model['d_model']}, {model['n_layers']} layers, "
        f"{s['parameters']:,} parameters, sequences of {s['seq_len']} bytes) trained for real "
        f"on {s['corpus']}: {s['train_sequences']:,} training and {s['test_sequences']:,} "
        f"validation sequences. Target: validation loss {s['target_loss']} nats per byte. "
        f"Strong scaling: every step's global batch of {s['global_batch']} sequences is split "
        f"evenly over the nodes; local optimizer {opt['name']} (lr {opt['lr']}). Compute-bound: "
        f"each step is charged {s['compute_scale']:,.0f}× its FLOPs, so one nominal node "
        f"(10 TFLOP/s) takes {s['global_step_s']:g} s for the global batch. Network-aware "
        f"rounds on {s['network']} with warm fixed costs ({s['fixed_costs']['task_s']} s per "
        f"task, {s['fixed_costs']['round_s']} s per round); the centralized cluster is one node "
        f"N× as fast with no network and no fixed costs, synchronous steps on the whole global "
        f"batch, evaluated every {s['eval_every_central']} steps. One seed; times are simulated "
        f"(`python -m bench.run --only scaling`, {data['bench_s']:.0f} s here).",
        "",
        "![speedup against nodes, and loss against simulated time](scaling.png)",
        "",
        f"### Time to loss {s['target_loss']} against nodes (network-aware, {s['network']})",
        "",
        "| nodes | batch per node | time to target (sim s) | speedup | efficiency | rounds "
        "| mean round (s) | utilization |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['nodes']} | {r['node_batch']} | {_fmt(r['time_to_target_s'])} | "
            f"{_times(r['speedup'])} | {_fmt(r['efficiency'], '.2f')} | "
            f"{_fmt(r['rounds_to_target'], 'd')} | {_fmt(r['mean_round_s'])} | "
            f"{r['utilization']:.3f} |"
            for r in aware
        ),
        "",
        "### Against a centralized cluster of the same total compute",
        "",
        "| nodes | centralized: one node N× as fast (sim s) | network-aware on "
        f"{s['network']} (sim s) | share of the centralized speed | goal |",
        "|---:|---:|---:|---:|---|",
        *(
            f"| {r['nodes']} | {_fmt(r['time_to_target_s'])} | {_fmt(r['network_aware_s'])} | "
            f"**{_fmt(r['fraction'], '.2f')}** | ≥ 0.80 |"
            for r in central
        ),
        "",
    ]
    if ten and fifty:
        lines += [
            "| figure | measured | goal |",
            "|---|---:|---|",
            f"| speedup at 10 nodes (efficiency) | {_times(ten['speedup'])} "
            f"({_fmt(ten['efficiency'], '.2f')}) | linear up to 10 |",
            f"| speedup at 50 nodes (efficiency) | {_times(fifty['speedup'])} "
            f"({_fmt(fifty['efficiency'], '.2f')}) | sub-linear to 50 |",
            "",
        ]
    return lines


def run(results_dir: Path) -> dict[str, Any]:
    print("scaling: byte transformer, network-aware on wan against a centralized cluster")
    data = measure()
    results_dir.mkdir(parents=True, exist_ok=True)
    chart(data, results_dir / "scaling.png")
    return data


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="bench.scaling_bench", description=__doc__)
    parser.add_argument("--step-s", type=float, default=GLOBAL_STEP_S, help="GLOBAL_STEP_S")
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODE_COUNTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = measure(args.nodes, args.step_s)
    for row in data["network_aware"]:
        row.pop("curve")
    for row in data["setup"].get("centralized_runs", []):
        row.pop("curve")
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
