"""Trainer benchmarks: scaling of FedAvg against naive sync, memory, and hot-path overheads.

Every figure that is a speed is reported as a ratio to a baseline measured in the same
process, so that results compare across machines.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainer.local import loss_fn, make_optimizer, train_local
from trainer.sim.federated import run_federated
from trainer.sim.naive import run_naive_sync
from trainer.sim.setup import prepare
from trainer.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits-mlp.yaml"


def scaling(node_counts=(1, 2, 4, 8, 16), networks=("lan", "wan")) -> list[dict[str, Any]]:
    """Time to 0.95, bytes and utilization for FedAvg and naive sync."""
    spec = load_spec(DIGITS)
    rows = []
    for network in networks:
        for n in node_counts:
            for method in ("fedavg", "naive_sync"):
                setup = prepare(spec, n, network, spec.seed)
                started = time.perf_counter()
                if method == "fedavg":
                    result, _ = run_federated(setup)
                else:
                    result, _ = run_naive_sync(setup)
                rows.append(
                    {
                        "network": network,
                        "nodes": n,
                        "method": method,
                        "reached": result.reached_target,
                        "rounds": result.rounds_to_target,
                        "time_to_target_s": result.time_to_target_s,
                        "bytes_up_to_target": result.bytes_up_to_target,
                        "bytes_up_per_node_to_target": (
                            result.bytes_up_to_target / n if result.bytes_up_to_target else None
                        ),
                        "utilization": result.utilization,
                        "final_accuracy": result.final_accuracy,
                        "host_s": time.perf_counter() - started,
                    }
                )
                print(f"  scaling {network:4} n={n:2} {method:10} {_fmt_row(rows[-1])}")
    _add_speedups(rows)
    return rows


def _fmt_row(row: dict[str, Any]) -> str:
    t = row["time_to_target_s"]
    return (
        f"t95={t:9.1f}s rounds={row['rounds']} util={row['utilization']:.3f}"
        if t is not None
        else "target not reached"
    )


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    """FedAvg's time to target as a ratio of naive sync's, on the same network and node count."""
    naive = {(r["network"], r["nodes"]): r for r in rows if r["method"] == "naive_sync"}
    for row in rows:
        base = naive[(row["network"], row["nodes"])]
        if row["time_to_target_s"] and base["time_to_target_s"]:
            row["time_vs_naive"] = row["time_to_target_s"] / base["time_to_target_s"]


def peak_memory_mb(nodes: int = 8, network: str = "wan") -> dict[str, Any]:
    """Peak RSS of a whole `gpuflex-sim run` in a fresh process (imports included)."""
    code = (
        "import resource, sys, json;"
        "from trainer.sim.cli import main;"
        f"main(['run', {str(DIGITS)!r}, '--nodes', '{nodes}', '--network', '{network}', '--json']);"
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    rss_kb = int(next(ln for ln in out.splitlines() if ln.startswith("MAXRSS")).split()[1])
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("{")))
    baseline = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource, torch, trainer.sim.cli;"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    import_kb = int(baseline.stdout.split()[-1])
    return {
        "nodes": nodes,
        "network": network,
        "peak_rss_mb": rss_kb / 1024,
        "imports_only_rss_mb": import_kb / 1024,
        "final_accuracy": result["final_accuracy"],
        "goal_mb": 460,
    }


def local_training_overhead(steps: int = 400, repeats: int = 7) -> dict[str, Any]:
    """train_local against a hand-written PyTorch loop on the same model, data and steps."""
    spec = load_spec(DIGITS)
    setup = prepare(spec, 1, "lan", spec.seed)
    data = setup.shards[0]
    model, state = setup.model, setup.initial_state
    batch = spec.local.batch_size

    def plain() -> float:
        model.load_state_dict(state)
        opt = make_optimizer(list(model.parameters()), spec.optimizer)
        gen = torch.Generator().manual_seed(0)
        x, y = data.x_train, data.y_train
        started = time.perf_counter()
        perm, pos = torch.randperm(len(x), generator=gen), 0
        for _ in range(steps):
            if pos >= len(x):
                perm, pos = torch.randperm(len(x), generator=gen), 0
            idx = perm[pos : pos + batch]
            pos += batch
            loss = loss_fn(model(x[idx]), y[idx], "classification")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return time.perf_counter() - started

    def ours() -> float:
        started = time.perf_counter()
        train_local(model, state, data, spec, seed=0, steps=steps)
        return time.perf_counter() - started

    plain(), ours()  # warm-up
    base, mine = [], []
    for _ in range(repeats):  # interleaved, so drift in machine load hits both alike
        base.append(plain())
        mine.append(ours())
    ratio = statistics.median(mine) / statistics.median(base)
    return {
        "steps": steps,
        "plain_loop_s": statistics.median(base),
        "train_local_s": statistics.median(mine),
        "ratio": ratio,
        "overhead_pct": 100 * (ratio - 1),
        "goal_pct": 5.0,
    }


_AGG_CODE = """
import resource, sys, torch
from trainer.aggregation import weighted_mean
k, numel = int(sys.argv[1]), int(sys.argv[2])
def updates():
    for i in range(k):
        yield {"w": torch.full((numel,), float(i))}, 1.0 + i
# Baseline: the peak with one update alive, so the figure is what aggregation adds on top.
first = next(updates())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
del first
out = weighted_mean(updates())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(base, peak)
"""


def aggregation_memory(numel: int = 64_000_000, counts=(4, 16, 64)) -> list[dict[str, Any]]:
    """Peak memory above one live update during streaming weighted-mean aggregation, in
    multiples of one model. The model (256 MB) is large enough that the process's import-time
    peak does not hide the growth."""
    model_mb = 4 * numel / 2**20
    rows = []
    for k in counts:
        out = subprocess.run(
            [sys.executable, "-c", _AGG_CODE, str(k), str(numel)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.split()
        before_kb, after_kb = (int(v) for v in out)
        growth_mb = (after_kb - before_kb) / 1024
        rows.append(
            {
                "updates": k,
                "model_mb": model_mb,
                "peak_growth_mb": growth_mb,
                "models": growth_mb / model_mb,
            }
        )
        print(
            f"  aggregation k={k:4} peak growth {growth_mb:7.1f} MB = {growth_mb / model_mb:.1f}x"
        )
    return rows
