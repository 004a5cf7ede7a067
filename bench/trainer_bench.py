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

from trainer.datasets import Dataset
from trainer.local import loss_fn, make_optimizer, train_local
from trainer.models import build_model
from trainer.sim.federated import run_federated
from trainer.sim.naive import run_naive_sync
from trainer.sim.setup import prepare
from trainer.spec import load_spec, parse_spec

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


# The models: a 25.6M-parameter byte transformer and a ResNet-18-sized CNN (11.2M).
GPU_MODELS: dict[str, dict[str, Any]] = {
    "transformer": {
        "model": {"arch": "transformer", "d_model": 512, "n_layers": 8, "n_heads": 8},
        "input": (256,),
        "classes": 256,
        "batch": 64,
        "steps": 100,
    },
    "resnet18": {
        "model": {"arch": "resnet", "channels": [64, 128, 256, 512], "blocks": 2},
        "input": (3, 32, 32),
        "classes": 10,
        "batch": 256,
        "steps": 60,
    },
}


def _synthetic(ref: dict[str, Any], n: int) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    if ref["classes"] == 256 and len(ref["input"]) == 1:  # bytes: predict the next one
        x = torch.randint(0, 256, (n, *ref["input"]), generator=gen)
        y, task = x.roll(-1, dims=1), "language_model"
    else:
        x = torch.randn((n, *ref["input"]), generator=gen)
        y, task = torch.randint(0, ref["classes"], (n,), generator=gen), "classification"
    return Dataset(
        name="bench", task=task, x_train=x, y_train=y, x_test=x[:1], y_test=y[:1],
        num_classes=ref["classes"], input_shape=ref["input"],
    )  # fmt: skip


def gpu_throughput(repeats: int = 5) -> dict[str, Any]:
    """train_local against a tuned plain bf16 loop (autocast, fused AdamW, TF32, data on the
    GPU, no per-step sync) on the same GPU, model and data: samples per second."""
    if not torch.cuda.is_available():
        print("  skipped: no CUDA device")
        return {"skipped": "no CUDA device"}
    device = torch.device("cuda")
    rows = [_gpu_compare(name, ref, device, repeats) for name, ref in GPU_MODELS.items()]
    return {"device": torch.cuda.get_device_name(device), "repeats": repeats, "models": rows}


def _gpu_compare(name: str, ref: dict[str, Any], device: torch.device, repeats: int) -> dict:
    batch, steps = ref["batch"], ref["steps"]
    spec = parse_spec(
        {
            "name": f"bench-{name}",
            "model": ref["model"],
            "optimizer": {"name": "adamw", "lr": 1e-3},
            "local": {"steps": steps, "batch_size": batch},
        }
    )
    data = _synthetic(ref, 16 * batch)
    model = build_model(spec.model, ref["input"], ref["classes"]).to(device)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}  # as a task's
    x, y = data.x_train.to(device), data.y_train.to(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    sync = torch.cuda.synchronize

    def plain(steps: int) -> float:
        model.load_state_dict(state)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=spec.optimizer.lr, fused=True)
        order = torch.randint(0, len(x), (steps, batch), device=device)
        sync()
        started = time.perf_counter()
        for i in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_fn(model(x[order[i]]), y[order[i]], data.task)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync()
        return steps * batch / (time.perf_counter() - started)

    def ours(steps: int) -> tuple[float, float, str]:
        """Samples/s over the training loop (what compute_s covers, as the desktop benchmark
        reports) and over the whole call (state load, data copy, the delta back to the host)."""
        sync()
        started = time.perf_counter()
        result = train_local(model, state, data, spec, seed=0, steps=steps)
        wall = time.perf_counter() - started
        return steps * batch / result.compute_s, steps * batch / wall, result.precision

    plain(5), ours(5)  # warm-up: kernels, allocator, autocast caches
    base, loop, whole = [], [], []
    for _ in range(repeats):  # interleaved, so drift in clocks and load hits both alike
        base.append(plain(steps))
        sps, wall_sps, precision = ours(steps)
        loop.append(sps)
        whole.append(wall_sps)
    row = {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": batch,
        "steps": steps,
        "precision": precision,
        "plain_bf16_samples_per_s": statistics.median(base),
        "train_local_samples_per_s": statistics.median(loop),
        "train_local_whole_call_samples_per_s": statistics.median(whole),
    }
    row["ratio"] = row["train_local_samples_per_s"] / row["plain_bf16_samples_per_s"]
    row["whole_call_ratio"] = (
        row["train_local_whole_call_samples_per_s"] / row["plain_bf16_samples_per_s"]
    )
    row["goal_ratio"] = 0.9
    print(
        f"  gpu {name:11} plain {row['plain_bf16_samples_per_s']:8.0f}/s  train_local "
        f"{row['train_local_samples_per_s']:8.0f}/s ({precision})  ratio {row['ratio']:.3f} "
        f"(whole call {row['whole_call_ratio']:.3f})"
    )
    return row


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
