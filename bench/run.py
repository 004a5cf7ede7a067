"""`make bench`: run every benchmark, write bench/results/results.json and results.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import (
    examples_bench,
    exported_bench,
    footprint_bench,
    load_bench,
    network_bench,
    pause_bench,
    privacy_bench,
    promises_bench,
    scaling_bench,
    slow_clients_bench,
    sweep_bench,
    trainer_bench,
    upload_bench,
    verification_bench,
    zones_bench,
)

RESULTS = Path(__file__).resolve().parent / "results"


def _f(value: Any, fmt: str = ".1f") -> str:
    return "—" if value is None else format(value, fmt)


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| network | nodes | method | time to 0.95 (sim s) | vs naive | rounds | "
        "MB up per node | utilization | final acc |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mb = r["bytes_up_per_node_to_target"]
        lines.append(
            f"| {r['network']} | {r['nodes']} | {r['method']} | {_f(r['time_to_target_s'])} | "
            f"{_f(r.get('time_vs_naive'), '.3f')} | {_f(r['rounds'], 'd')} | "
            f"{_f(mb and mb / 1e6, '.2f')} | {r['utilization']:.3f} | {r['final_accuracy']:.3f} |"
        )
    return "\n".join(lines)


def comparison_table(data: dict[str, Any]) -> str:
    lines = [
        "| method | time to 0.95 (sim s) | rounds | KB up per node | final acc | utilization "
        "| idle |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method in ("naive_sync", "fedavg", "network_aware"):
        r = data[method]
        kb = r["bytes_up_per_node_to_target"]
        lines.append(
            f"| {method} | {_f(r['time_to_target_s'])} | {_f(r['rounds_to_target'], 'd')} | "
            f"{_f(kb and kb / 1e3, '.1f')} | {r['final_accuracy']:.4f} | "
            f"{r['utilization']:.3f} | {r['idle_fraction']:.3f} |"
        )
    return "\n".join(lines)


def render_network(n: dict[str, Any]) -> list[str]:
    mlp, cnn, het, flaky = n["mlp_wan"], n["cnn_wan"], n["hetero"], n["flaky"]
    r = mlp["ratios"]
    aware = mlp["network_aware"]
    return [
        "## Network-aware training (digits, 8 nodes, simulator)",
        "",
        "![accuracy against simulated time](accuracy_vs_time.png)",
        "",
        "### MLP on wan",
        "",
        comparison_table(mlp),
        "",
        "| figure | measured | goal |",
        "|---|---:|---|",
        f"| time to 0.95, network-aware / naive sync | {_f(r['time_aware_over_naive'], '.4f')} "
        "| ≤ 0.1 |",
        f"| time to 0.95, network-aware / plain FedAvg | "
        f"{_f(r['time_aware_over_fedavg'], '.3f')} | ≤ 0.5 |",
        f"| bytes up per node to 0.95, plain FedAvg / network-aware | "
        f"{_f(r['bytes_fedavg_over_aware'], '.0f')}× | ≥ 50× |",
        f"| final accuracy, network-aware − plain FedAvg | "
        f"{100 * r['accuracy_aware_minus_fedavg']:+.2f} points | within 1 point |",
        f"| rounds to 0.95 (8 IID nodes) | {_f(aware['rounds_to_target'], 'd')} | ≤ 10 |",
        f"| compute utilization, 8 nodes on wan | {aware['utilization']:.3f} | ≥ 0.9 |",
        f"| hetero (4× spread): idle fraction, network-aware | "
        f"{het['network_aware_idle_fraction']:.3f} (equal work: "
        f"{het['equal_work_idle_fraction']:.3f}) | ≤ 0.10 |",
        f"| flaky (20 % drop per round): time vs the same nodes on wan, median of "
        f"{len(flaky['per_seed'])} seeds | {flaky['median_slowdown']:.2f}× (per seed: "
        + ", ".join(f"{row['slowdown']:.2f}" for row in flaky["per_seed"])
        + f"; {flaky['node_rounds_dropped']} of {flaky['node_rounds']} node-rounds dropped; "
        f"all reached 0.95: {flaky['all_reached_target']}) | ≤ 1.3× |",
        "",
        "### CNN on wan",
        "",
        comparison_table(cnn),
        "",
    ]


REAL = "real processes"
SIMULATOR = "the simulator (trainer/sim), not the real system"
IN_PROCESS = "in-process: the trainer's or marketplace's functions called in the bench's process"
# Where each section's figures come from, by its heading's start: every table says it.
SOURCES: tuple[tuple[str, str], ...] = (
    ("## FedAvg against naive", SIMULATOR),
    ("## Memory", f"{IN_PROCESS} (the simulator's process, the aggregation functions)"),
    ("## Local training overhead", IN_PROCESS),
    ("## Local training on a GPU", IN_PROCESS),
    ("## Regional aggregation", SIMULATOR),
    ("## Network-aware training", SIMULATOR),
    (
        "## Marketplace",
        f"heartbeats: {REAL} (`gpuflex serve`); scheduling and charges: {IN_PROCESS}",
    ),
    ("## Slow clients", f"{REAL} (`gpuflex serve`, nginx)"),
    ("## Server CPU per request", f"{REAL} (`gpuflex serve`)"),
    ("## Load:", f"{REAL} (`gpuflex serve`, Locust, a Celery worker)"),
    ("## A real round", f"{REAL} (`gpuflex serve`, the worker, `gpuflex-node` agents)"),
    ("## The real system", f"{REAL}, with the simulator's prediction beside them, labelled"),
    ("## Inference through", f"{REAL} (the marketplace and its agents) against one process"),
    ("## Scaling on a compute-bound", SIMULATOR),
    ("## Chunked dataset upload", f"{REAL} (`gpuflex serve` on loopback)"),
    ("## Example loss curves", SIMULATOR),
    (
        "## Pausing for a game",
        f"{REAL} (the agent, its sandbox and task runner; the "
        "marketplace is the agent-API test double)",
    ),
    ("## Privacy", SIMULATOR),
    ("## Hyperparameter sweep", IN_PROCESS),
    ("## Promises", "each row says: `real processes` yes or no"),
    (
        "## A GPU owner's footprint",
        f"{REAL} (a `gpuflex-node` agent against the agent-API test double; the built "
        "installer and pack files)",
    ),
    (
        "## Verification",
        f"trials: {IN_PROCESS} (train_local, the agreement and segment rules); overhead: {REAL} "
        "(`gpuflex serve`, the worker, 20 `gpuflex-node` agents, one cheating)",
    ),
    (
        "## Exported models",
        f"accuracy: {SIMULATOR}; samples/s and checking: {IN_PROCESS}; the accuracy "
        f"through real agents: {REAL} (`gpuflex serve`, the worker, `gpuflex-node` agents)",
    ),
)


def with_sources(lines: list[str]) -> list[str]:
    """Each section's heading followed by where its figures come from (SOURCES)."""
    out: list[str] = []
    for line in lines:
        out.append(line)
        if line.startswith("## "):
            source = next((src for head, src in SOURCES if line.startswith(head)), None)
            if source is None:
                raise ValueError(f"bench/run.py SOURCES says nothing of section {line!r}")
            out += ["", f"Figures from: {source}."]
    return out


def render(results: dict[str, Any]) -> str:
    t = results["trainer"]
    mem = t["peak_memory"]
    over = t["local_overhead"]
    agg = t["aggregation_memory"]
    parts = [
        "# GPUFlex benchmark results",
        "",
        f"Machine: {results['machine']}. Generated by `make bench` (the last sections run took "
        f"{results['bench_s']:.0f} s).",
        "",
        "## FedAvg against naive synchronous data parallel (digits MLP, simulator)",
        "",
        "Time is simulated wall-clock time; `vs naive` is FedAvg's time to 0.95 accuracy "
        "divided by naive sync's on the same network and node count.",
        "",
        scaling_table(t["scaling"]),
        "",
        "## Memory",
        "",
        f"- Peak RSS of `gpuflex-sim run examples/digits-mlp.yaml --nodes {mem['nodes']} "
        f"--network {mem['network']}`: **{mem['peak_rss_mb']:.0f} MB** "
        f"(goal < {mem['goal_mb']} MB; "
        f"importing torch and the trainer alone: {mem['imports_only_rss_mb']:.0f} MB).",
        "- Streaming weighted-mean aggregation, peak memory growth in multiples of one model "
        f"({agg[0]['model_mb']:.0f} MB):",
        "",
        "| updates | peak growth (MB) | × model size |",
        "|---:|---:|---:|",
        *(f"| {r['updates']} | {r['peak_growth_mb']:.1f} | {r['models']:.2f} |" for r in agg),
        "",
        "## Local training overhead",
        "",
        f"`train_local` against a plain PyTorch loop, {over['steps']} steps, median of "
        f"interleaved runs: ratio **{over['ratio']:.3f}** ({over['overhead_pct']:+.1f} %; "
        f"goal ≤ {over['goal_pct']:.0f} %).",
        "",
    ]
    if "gpu" in results:
        parts += render_gpu(results["gpu"])
    if "exported" in results:
        parts += exported_bench.render(results["exported"])
    if "verification" in results:
        parts += verification_bench.render(results["verification"])
    if "zones" in results:
        parts += render_zones(results["zones"])
    if "network" in results:
        parts += render_network(results["network"])
    if "marketplace" in results:
        parts += render_marketplace(results["marketplace"])
    if "slow_clients" in results:
        parts += render_slow_clients(results["slow_clients"])
    if "load" in results:
        parts += load_bench.render(results["load"])
    if "footprint" in results:
        parts += footprint_bench.render_node(results["footprint"])
    if "rounds" in results:
        parts += render_rounds(results["rounds"])
    if "live" in results:
        parts += render_live(results["live"])
    if "inference" in results:
        parts += render_inference(results["inference"])
    if "scaling" in results:
        parts += scaling_bench.render(results["scaling"])
    if "upload" in results:
        parts += upload_bench.render(results["upload"])
    if "examples" in results:
        parts += examples_bench.render(results["examples"])
    if "pause" in results:
        parts += pause_bench.render(results["pause"])
    if "privacy" in results:
        parts += privacy_bench.render(results["privacy"])
    if "sweep" in results:
        parts += ["", *sweep_bench.render(results["sweep"])]
    if "promises" in results:
        parts += ["", *promises_bench.render(results["promises"])]
    return "\n".join(with_sources("\n".join(parts).split("\n")))


def render_gpu(g: dict[str, Any]) -> list[str]:
    head = ["## Local training on a GPU: train_local against a tuned plain bf16 loop", ""]
    if "skipped" in g:
        return [*head, f"skipped: {g['skipped']}", ""]
    return [
        *head,
        *([g["measured"], ""] if g.get("measured") else []),
        f"{g['device']}, median of {g['repeats']} interleaved runs after a warm-up; the plain "
        "loop uses bf16 autocast, fused AdamW, TF32 and data on the GPU without per-step syncs. "
        "`whole call` also counts loading the state, copying the data and returning the delta.",
        "",
        "| model | parameters | batch | precision | plain samples/s | train_local samples/s | "
        "ratio | whole call | goal |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|",
        *(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['batch']} | {r['precision']} | "
            f"{r['plain_bf16_samples_per_s']:.0f} | {r['train_local_samples_per_s']:.0f} | "
            f"**{r['ratio']:.3f}** | {r['whole_call_ratio']:.3f} | ≥ {r['goal_ratio']:.2f} |"
            for r in g["models"]
        ),
        "",
    ]


def marketplace_section() -> dict[str, Any]:
    """In a subprocess: the scheduling bench sets up Django in-process on its own database."""
    env = {**os.environ}
    env.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuflex_bench")
    out = subprocess.run(
        [sys.executable, "-m", "bench.marketplace_bench"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout)


def load_section() -> dict[str, Any]:
    """In a subprocess: it sets up Django in-process to seed its own database."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.load_bench"],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def render_zones(z: dict[str, Any]) -> list[str]:
    rows = [
        "| run | time to 0.95 (sim s) | rounds | KB into the coordinator per round | "
        "median round (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, r in z["runs"].items():
        if isinstance(r, dict):
            rows.append(
                f"| {key} | {_f(r['time_to_target_s'])} | {r['rounds']} | "
                f"{r['bytes_in_per_round'] / 1e3:.0f} | {r['median_round_s']:.2f} |"
            )
    return [
        f"## Regional aggregation ({z['zones']} zones x {z['nodes'] // z['zones']} nodes, "
        f"{z['network']}, digits MLP, simulator)",
        "",
        *rows,
        "",
        f"The coordinator receives {z['bytes_in_ratio']:.1f}x fewer bytes per round with zones "
        "(`python -m bench.run --only zones`; docs/scale.md says what the times assume).",
        "",
    ]


def render_slow_clients(r: dict[str, Any]) -> list[str]:
    def cell(run: dict[str, Any] | None) -> str:
        if run is None:
            return "— (nginx not installed)"
        if run["timed_out"] == run["requests"]:
            return f"all {run['requests']} timed out (> {run['timeout_s']:.0f} s)"
        late = f", {run['timed_out']} timed out" if run["timed_out"] else ""
        return f"p50 {run['p50_ms']:.0f} ms, max {run['max_ms']:.0f} ms{late}"

    g, n = r.get("alone") or r["gunicorn"], r["nginx"]  # "gunicorn": results before granian
    return [
        "## Slow clients (`gpuflex serve`, alone and behind `gpuflex nginx-config`)",
        "",
        f"{r['slow_clients']} connections send an authenticated heartbeat's headers and then one "
        f"byte of its body a second, against {r['workers']} workers × {r['threads']} threads; "
        "meanwhile an honest client sends requests one after another "
        "(`python -m bench.run --only slow_clients`).",
        "",
        "| honest requests | server alone | behind nginx |",
        "|---|---|---|",
        f"| no slow clients (baseline) | {cell(g['baseline'])} | {cell(n and n['baseline'])} |",
        f"| with the slow clients | {cell(g['slow'])} | {cell(n and n['slow'])} |",
        "",
    ]


def render_marketplace(m: dict[str, Any]) -> list[str]:
    hb, sc, ch = m["heartbeat"], m["scheduling"], m.get("charging")
    return [
        f"## Marketplace ({hb['database']})",
        "",
        "| figure | measured | goal |",
        "|---|---:|---|",
        f"| heartbeats/s against `gpuflex serve` ({hb['workers']} workers × {hb['threads']} "
        f"threads, {hb['clients']} clients, {hb['duration_s']:.0f} s) | "
        f"{hb['heartbeats_per_s']:.0f}/s, p50 {hb['p50_ms']:.0f} ms, p99 {hb['p99_ms']:.0f} ms "
        f"({hb['ratio_to_baseline']:.2f}× the {hb['baseline_401_per_s']:.0f}/s of a 401 "
        "that touches no database) | ≥ 1,000/s, p99 < 100 ms |",
        # lease_batch is called in this process and nowhere in the server: its figure is not
        # the product's, which is the claim path through `gpuflex serve` (the Load section)
        f"| `lease_batch` (in-process; the server never calls it, not the product's "
        f"scheduling: see the Load section's claim path) leasing {sc['tasks']:,} tasks over "
        f"{sc['nodes']:,} nodes | {sc['bulk_s']:.2f} s ({sc['speedup_vs_one_by_one']:.0f}× "
        f"one in-process `claim_next` at a time, {sc['one_claim_ms']:.1f} ms each) | — |",
        *(
            [
                f"| ledger charges for {ch['results']:,} verified results | "
                f"{ch['charges_per_s']:.0f}/s, {ch['charge_ms']:.1f} ms each "
                f"({ch['ratio_to_baseline']:.1f}× saving the result itself, "
                f"{ch['baseline_save_ms']:.1f} ms) | — |"
            ]
            if ch
            else []
        ),
        "",
    ]


SECTIONS = (
    "trainer", "gpu", "network", "marketplace", "slow_clients", "rounds", "live", "scaling",
    "load", "pause", "upload", "examples", "privacy", "inference", "zones", "sweep",
    "promises", "footprint", "exported", "verification",
)  # fmt: skip


def inference_section() -> dict[str, Any]:
    """Inference through the real marketplace (5 agents) against one process, in a
    subprocess: it sets up Django on its own demo database."""
    print("inference: rows/s through the marketplace with 5 agents against one process")
    cmd = [sys.executable, "-m", "bench.inference_bench"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def render_inference(r: dict[str, Any]) -> list[str]:
    return [
        f"## Inference through the marketplace ({r['agents']} agents, {r['rows']:,} rows)",
        "",
        f"MLP {r['features']}-{'-'.join(map(str, r['hidden']))}-{r['classes']} over "
        f"{r['rows']:,} rows in {r['tasks']} tasks; the single process runs "
        f"trainer.scoring.predict on {r['single_process_threads']} torch thread(s) on a machine "
        f"of {r['cpus']} CPUs, which the agents share.",
        "",
        "| figure | measured |",
        "|---|---:|",
        f"| single process, rows/s | {r['single_process_rows_per_s']:,.0f} |",
        f"| marketplace, rows/s (accepted submission to completed job) | "
        f"{r['marketplace_rows_per_s']:,.0f} |",
        f"| ratio marketplace / single process | {r['ratio']:.3f} |",
        f"| job wall time, s | {r['marketplace_job_s']:.1f} |",
        f"| submission (upload, checks, shards), s | {r['submit_s']:.1f} |",
        f"| rows back in order, each once | {r['rows_in_order']} |",
        f"| predictions agreeing with the single process | {r['prediction_agreement']:.4f} |",
        "",
    ]


def rounds_section() -> dict[str, Any]:
    """The real system's rounds, cold tasks (before) then warm workers (after), each run in a
    subprocess: each sets up Django on its own demo database."""
    out = {}
    for mode in ("cold", "warm"):
        for demo in (False, True):
            what = "gpuflex demo's job" if demo else "the Flower-matched digits job"
            print(f"rounds: {what} through the real marketplace, {mode} tasks")
            cmd = [sys.executable, "-m", "bench.rounds_bench", "--mode", mode]
            done = subprocess.run(cmd + ["--demo"] * demo, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
            out[f"{mode}_demo" if demo else mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def render_rounds(r: dict[str, Any]) -> list[str]:
    from bench.rounds_bench import PHASES

    cold, warm = r["cold"], r["warm"]

    def share(run: dict[str, Any], phase: str) -> str:
        seconds = run["median_phase_s"][phase]
        total = sum(run["median_phase_s"].values()) or 1.0
        return f"{seconds:.2f} s ({100 * seconds / total:.0f} %)"

    return [
        "## A real round, phase by phase (marketplace, worker, 5 lan agents, digits MLP)",
        "",
        "Plain FedAvg (sgd 0.05, momentum 0.9, batch 32, one epoch, quorum 1.0) through "
        "`gpuflex serve`, a Celery worker and five `gpuflex-node` processes; medians over "
        "rounds of each phase on the round's critical path (`python -m bench.run --only rounds`).",
        "",
        "| phase | cold tasks (before) | warm task workers (after) |",
        "|---|---:|---:|",
        *(f"| {p} | {share(cold, p)} | {share(warm, p)} |" for p in PHASES),
        f"| **round wall time** (median) | **{cold['median_round_s']:.2f} s** | "
        f"**{warm['median_round_s']:.2f} s** (goal ≤ 2 s) |",
        f"| peak memory, all processes (PSS summed) | {cold['peak_memory_mb']:,} MB | "
        f"{warm['peak_memory_mb']:,} MB (goal ≤ 2,048 MB) |",
        f"| peak resident sizes summed (shared pages once per process) | "
        f"{_f(cold.get('peak_rss_sum_mb'), ',')} MB | {_f(warm.get('peak_rss_sum_mb'), ',')} MB |",
        f"| `gpuflex demo` to 0.95 (its own job: adaptive, wan and flaky nodes) | "
        f"{r['cold_demo']['wall_s']:.0f} s, {r['cold_demo']['rounds']} rounds, median round "
        f"{r['cold_demo']['median_round_s']:.1f} s | {r['warm_demo']['wall_s']:.0f} s, "
        f"{r['warm_demo']['rounds']} rounds, median round "
        f"{r['warm_demo']['median_round_s']:.1f} s (goal ≤ 60 s) |",
        "",
    ]


def live_section() -> dict[str, Any]:
    """The real system against the simulator: plain FedAvg, then network-aware, each through
    the marketplace and five wan agents in a subprocess (each sets up Django on its own demo
    database), with the simulator's prediction for the same setting."""
    from bench import live_bench

    out = {}
    for mode in live_bench.MODES:
        print(f"live: {mode} through the real marketplace, 5 wan agents, and the simulator")
        cmd = [sys.executable, "-m", "bench.live_bench", "--mode", mode]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=live_bench.TIMEOUT_S + 300)  # fmt: skip
        except subprocess.TimeoutExpired:
            out[mode] = {"mode": mode, "measured": {"error": "timed out"}, "predicted": None}
            continue
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**missed**")


def render_live(r: dict[str, Any]) -> list[str]:
    from bench.live_bench import GOAL_BYTES_RATIO, GOAL_SIM_FACTOR, GOAL_TIME_RATIO, TARGET

    plain, aware = (r[m].get("measured") or {} for m in ("plain", "aware"))
    sim = {m: r[m].get("predicted") or {} for m in ("plain", "aware")}

    def traffic(m: dict[str, Any]) -> float | None:
        up, down = m.get("mean_bytes_up_per_node"), m.get("mean_bytes_down_per_node")
        return None if up is None or down is None else up + down

    def reached(m: dict[str, Any], key: str = "time_to_target_s") -> str:
        if "error" in m:
            return f"failed: {m['error']}"
        t = m.get(key)
        return f"{t:.1f} s" if t is not None else f"not reached ({m.get('status', '?')})"

    def kb(v: float | None) -> str:
        return _f(v and v / 1e3, ",.1f")

    def sim_factor(m: dict[str, Any], p: dict[str, Any]) -> float | None:
        return _ratio(m.get("time_to_target_s"), p.get("time_to_target_s"))

    def within(f: float | None) -> bool | None:
        return None if f is None else 1 / GOAL_SIM_FACTOR <= f <= GOAL_SIM_FACTOR

    time_ratio = _ratio(aware.get("time_to_target_s"), plain.get("time_to_target_s"))
    bytes_ratio = _ratio(traffic(plain), traffic(aware))
    f_plain, f_aware = sim_factor(plain, sim["plain"]), sim_factor(aware, sim["aware"])
    rows = [
        ("wall time to 0.95, measured", reached(plain), reached(aware)),
        ("rounds", _f(plain.get("rounds"), "d"), _f(aware.get("rounds"), "d")),
        ("final accuracy", _f(plain.get("final_accuracy"), ".3f"),
         _f(aware.get("final_accuracy"), ".3f")),
        ("simulator's predicted time to 0.95", reached(sim["plain"]), reached(sim["aware"])),
        ("simulator's rounds to 0.95", _f(sim["plain"].get("rounds_to_target"), "d"),
         _f(sim["aware"].get("rounds_to_target"), "d")),
        ("measured / predicted time", _f(f_plain, ".2f"), _f(f_aware, ".2f")),
        ("kB up per node (server's counters, mean)", kb(plain.get("mean_bytes_up_per_node")),
         kb(aware.get("mean_bytes_up_per_node"))),
        ("kB down per node (server's counters, mean)",
         kb(plain.get("mean_bytes_down_per_node")), kb(aware.get("mean_bytes_down_per_node"))),
        ("kB up per node, simulator", kb(sim["plain"].get("bytes_up_per_node")),
         kb(sim["aware"].get("bytes_up_per_node"))),
        ("kB down per node, simulator (no shards)", kb(sim["plain"].get("bytes_down_per_node")),
         kb(sim["aware"].get("bytes_down_per_node"))),
        ("compute utilization, measured", _f(plain.get("utilization"), ".4f"),
         _f(aware.get("utilization"), ".4f")),
        ("compute utilization, simulator", _f(sim["plain"].get("utilization"), ".4f"),
         _f(sim["aware"].get("utilization"), ".4f")),
        ("tasks leased (codecs)", _codecs(plain), _codecs(aware)),
    ]  # fmt: skip
    goals = [
        (f"time to {TARGET}, network-aware / plain FedAvg", _f(time_ratio, ".3f"),
         f"≤ {GOAL_TIME_RATIO}", time_ratio is not None and time_ratio <= GOAL_TIME_RATIO
         if plain.get("time_to_target_s") else None),
        ("bytes up + down per node, plain FedAvg / network-aware",
         _f(bytes_ratio, ".1f") + "×" if bytes_ratio else "—", f"≥ {GOAL_BYTES_RATIO:.0f}×",
         None if bytes_ratio is None else bytes_ratio >= GOAL_BYTES_RATIO),
        ("simulator's time within 2× of measured, plain FedAvg", _f(f_plain, ".2f") + "×"
         if f_plain else "—", "0.5–2×", within(f_plain)),
        ("simulator's time within 2× of measured, network-aware", _f(f_aware, ".2f") + "×"
         if f_aware else "—", "0.5–2×", within(f_aware)),
    ]  # fmt: skip
    return [
        "## The real system, measured as the simulator is (digits MLP, 5 wan agents)",
        "",
        "`python -m bench.run --only live`: `gpuflex serve`, a Celery worker and five "
        "`gpuflex-node` processes (platform nodes: no verification replicas), each agent behind "
        "its simulated wan transport (real-time delays), train `gpuflex demo`'s digits MLP to "
        f"{TARGET} as plain FedAvg (fp32, equal work, quorum 1.0) and network-aware (adaptation "
        "on, codec auto, quorum 0.8, overlap on, int8 model deltas). The demo submits once "
        "its agents are online. Bytes are "
        "payload bytes from the server's own counters (NodeTraffic); utilization is the "
        "simulator's definition, compute s / (nodes × wall s), from the compute the nodes "
        "reported on accepted uploads. The prediction is the simulator on the same spec, five "
        "nodes with the agents' links, its default (warm) fixed costs.",
        "",
        "| figure | plain FedAvg | network-aware |",
        "|---|---:|---:|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        "| goal | measured | goal | |",
        "|---|---:|---|---|",
        *(f"| {a} | {b} | {c} | {_met(ok)} |" for a, b, c, ok in goals),
        "",
    ]


def _codecs(m: dict[str, Any]) -> str:
    codecs = m.get("codecs")
    if not codecs:
        return "—"
    return f"{m['tasks']} (" + ", ".join(f"{c} {n}" for c, n in sorted(codecs.items())) + ")"


def run_trainer(quick: bool) -> dict[str, Any]:
    nodes = (1, 4) if quick else (1, 2, 4, 8, 16)
    print("trainer: FedAvg vs naive sync")
    trainer = {"scaling": trainer_bench.scaling(node_counts=nodes)}
    print("trainer: peak memory")
    trainer["peak_memory"] = trainer_bench.peak_memory_mb()
    print("trainer: local training overhead")
    trainer["local_overhead"] = trainer_bench.local_training_overhead()
    print("trainer: aggregation memory")
    trainer["aggregation_memory"] = trainer_bench.aggregation_memory()
    return trainer


def run_network() -> dict[str, Any]:
    print("network-aware training")
    network = {
        "mlp_wan": network_bench.comparison(network_bench.MLP),
        "hetero": network_bench.hetero_idle(),
        "flaky": network_bench.flaky_slowdown(),
        "cnn_wan": network_bench.comparison(network_bench.CNN),
        "round1_plan": network_bench.policy_plan_example(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    network_bench.chart(network["mlp_wan"], RESULTS / "accuracy_vs_time.png")
    return network


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--quick", action="store_true", help="fewer configurations")
    parser.add_argument(
        "--only", choices=SECTIONS, action="append", help="re-run these sections, keep the rest"
    )
    args = parser.parse_args(argv)
    # The simulated models are tiny: intra-op threads only add synchronisation overhead.
    torch.set_num_threads(1)
    started = time.perf_counter()
    path = RESULTS / "results.json"
    results: dict[str, Any] = json.loads(path.read_text()) if args.only and path.exists() else {}
    for section in args.only or SECTIONS:
        if section == "trainer":
            results["trainer"] = run_trainer(args.quick)
        elif section == "gpu":
            print("gpu: train_local against a tuned plain bf16 loop")
            results["gpu"] = trainer_bench.gpu_throughput()
        elif section == "network":
            results["network"] = run_network()
        elif section == "rounds":
            results["rounds"] = rounds_section()
        elif section == "live":
            results["live"] = live_section()
        elif section == "inference":
            results["inference"] = inference_section()
        elif section == "scaling":
            results["scaling"] = scaling_bench.run(RESULTS)
        elif section == "pause":
            print("pause: a game starting mid-task, the real agent and sandbox")
            results["pause"] = pause_bench.run()
        elif section == "privacy":
            print("privacy: digits accuracy without privacy, with DP at ε = 8 and ε = 2")
            results["privacy"] = privacy_bench.run()
        elif section == "sweep":
            print("sweep: examples/digits-sweep.yaml's 16 trials against digits-mlp.yaml")
            results["sweep"] = sweep_bench.run()
        elif section == "load":
            print("load: 1,000 Locust agents against gpuflex serve on PostgreSQL and Redis")
            results["load"] = load_section()
        elif section == "upload":
            print("upload: a 500 MB dataset in chunks through gpuflex serve, beside a file copy")
            results["upload"] = upload_bench.run()
        elif section == "examples":
            results["examples"] = examples_bench.run()
        elif section == "exported":
            results["exported"] = exported_bench.run()
        elif section == "verification":
            print("verification: honest replicas and cheats of real tasks, segment checks")
            results["verification"] = verification_bench.run()
        elif section == "zones":
            print("zones: flat uploads against 3 zone aggregators, 24 wan nodes (simulator)")
            results["zones"] = zones_bench.run()
        elif section == "footprint":
            print("footprint: an idle registered node's memory, the installer's size (#32)")
            results["footprint"] = footprint_bench.node_section()
        elif section == "promises":
            results["promises"] = promises_bench.run()
        elif section == "slow_clients":
            print("slow clients: the server alone, then behind nginx")
            results["slow_clients"] = slow_clients_bench.run()
        else:
            print("marketplace: heartbeats and scheduling")
            results["marketplace"] = marketplace_section()
    results["machine"] = (
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    )
    results["bench_s"] = time.perf_counter() - started
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    markdown = render(results)
    (RESULTS / "results.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
