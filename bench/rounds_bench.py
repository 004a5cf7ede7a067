"""Where a real round's time goes: the marketplace, a Celery worker and five agent processes
train the Flower-matched digits job, and each round's wall time (one round opening to the
next) is split into phases from the server's timestamps and the agents' traces.

    python -m bench.rounds_bench --mode warm|cold     one run, JSON on stdout
    python -m bench.run --only rounds                 both, cold first: the before and after

`cold` starts every task in a fresh sandboxed interpreter (GPUFLEX_WARM_TASKS=0), as before
warm task workers; `warm` forks each task from the agent's warm worker. The phases follow the
round's critical path: the task whose upload closed the round.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil
import yaml

# plain FedAvg on the digits MLP (9,610 parameters), as Flower's quickstart trains it
SPEC_FLOWER = {
    "name": "rounds-bench",
    "seed": 0,
    "dataset": {"kind": "digits", "test_fraction": 0.2},
    "model": {"arch": "mlp", "hidden": [128]},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    "local": {"epochs": 1, "batch_size": 32},
    # enough rounds for medians; plain FedAvg at lr 0.05 needs ~20 to reach 0.95, and the
    # time to 0.95 is measured on `gpuflex demo`'s own job instead (--demo)
    "rounds": {"max_rounds": 8, "target": {"metric": "accuracy", "value": 0.99},
               "quorum": 1.0, "deadline_s": 60},
    "aggregation": {"strategy": "fedavg"},
    "sharding": {"method": "stratified", "num_shards": 5},
    "compression": {"codec": "none"},
}  # fmt: skip

PHASES = ("claim wait", "download", "sandbox start", "imports", "train", "encode", "upload",
          "verification", "queue wait", "aggregation", "next open", "agent other")  # fmt: skip


def _pss_bytes(p: psutil.Process) -> int:
    """The process's proportional share of the memory it maps: pages shared with other
    processes (a forked task and its warm worker, the libraries every Python maps) count once
    over all of them, so the sum over processes is the memory the demo actually holds."""
    try:
        with open(f"/proc/{p.pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return p.memory_info().rss  # no smaps (not Linux): resident memory, shared pages and all


def _memory_sampler(root_pid: int, stop: threading.Event, peak: dict[str, float]) -> None:
    """The whole demo's memory, summed over its processes, every 0.5 s: PSS (the goal's
    measure) and resident sizes (which count each shared page once per process)."""
    me = psutil.Process(root_pid)
    while not stop.wait(0.5):
        pss = rss = 0
        try:
            procs = [me, *me.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss += p.memory_info().rss
                pss += _pss_bytes(p)
        peak["pss"] = max(peak["pss"], pss / 2**20)
        peak["rss"] = max(peak["rss"], rss / 2**20)


def _traces(root: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for path in root.glob("agents/*/data/trace.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            out.setdefault(e["task"], {})[e["phase"]] = e["t"]
    return out


def _phases(root: Path, job_id: str) -> list[dict[str, Any]]:
    from marketplace.rounds.models import Round, TaskResult

    traces = _traces(root)
    rounds = list(Round.objects.filter(job_id=job_id).order_by("number"))
    rows = []
    for rnd, nxt in itertools.pairwise(rounds):
        closed = rnd.closed_at.timestamp()
        results = TaskResult.objects.filter(task__round=rnd, created_at__lte=rnd.closed_at)
        last = results.order_by("-created_at").select_related("task").first()
        t = traces.get(str(last.task_id), {}) if last else {}
        need = ("claimed", "downloaded", "sandbox_called", "runner_started", "runner_imported",
                "runner_trained", "runner_encoded", "upload_started", "uploaded")  # fmt: skip
        if not all(k in t for k in need) or "aggregation_started_at" not in rnd.metrics:
            continue
        opened, agg0 = rnd.opened_at.timestamp(), rnd.metrics["aggregation_started_at"]
        agg1 = agg0 + rnd.metrics["aggregation_s"]
        wall = nxt.opened_at.timestamp() - opened
        phase = {
            "claim wait": t["claimed"] - opened,
            "download": t["downloaded"] - t["claimed"],
            "sandbox start": t["runner_started"] - t["sandbox_called"],
            "imports": t["runner_imported"] - t["runner_started"],
            "train": t["runner_trained"] - t["runner_imported"],
            "encode": t["runner_encoded"] - t["runner_trained"],
            "upload": t["uploaded"] - t["upload_started"],
            "verification": closed - t["uploaded"],
            "queue wait": agg0 - closed,
            "aggregation": agg1 - agg0,
            "next open": nxt.opened_at.timestamp() - agg1,
        }
        phase["agent other"] = wall - sum(phase.values())  # journaling, hashing, handing over
        rows.append({"round": rnd.number, "wall_s": wall, "phases": phase})
    return rows


def run(mode: str, demo: bool = False) -> dict[str, Any]:
    """One run; `demo`: `gpuflex demo`'s own job and nodes (for its time to 0.95) instead of
    the Flower-matched job on five lan agents."""
    os.environ["GPUFLEX_WARM_TASKS"] = "1" if mode == "warm" else "0"
    os.environ["GPUFLEX_TRACE"] = "1"
    from marketplace.demo.cluster import NodePlan
    from marketplace.demo.run import NODES, SPEC, Options
    from marketplace.demo.run import run as run_demo

    nodes = (NodePlan("platform-lan", kind="platform", price="3.00"),
             *(NodePlan(f"volunteer-lan-{c}", price="2.00") for c in "abcd"))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuflex-rounds-") as tmp:
        root = Path(tmp) / "demo"
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump(SPEC_FLOWER))
        if demo:
            spec, nodes = SPEC, NODES
        stop, peak = threading.Event(), {"pss": 0.0, "rss": 0.0}
        sampler = threading.Thread(target=_memory_sampler, args=(os.getpid(), stop, peak))
        sampler.start()
        try:
            summary = run_demo(Options(data_dir=root, spec=spec, nodes=nodes, quiet=True,
                                       budget="5.00", timeout_s=600))  # fmt: skip
        finally:
            stop.set()
            sampler.join()
        rows = _phases(root, summary["job_id"])
    medians = {p: statistics.median(r["phases"][p] for r in rows) for p in PHASES} if rows else {}
    return {
        "mode": mode,
        "status": summary["status"],
        "reached_target": summary["reached_target"],
        "rounds": summary["rounds"],
        "wall_s": summary["wall_s"],
        "round_wall_s": [round(r["wall_s"], 2) for r in rows],
        "median_round_s": statistics.median(r["wall_s"] for r in rows) if rows else None,
        "median_phase_s": medians,
        "peak_memory_mb": round(peak["pss"]),  # PSS summed: the goal's "≤ 2 GB"
        "peak_rss_sum_mb": round(peak["rss"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.rounds_bench")
    parser.add_argument("--mode", choices=("cold", "warm"), default="warm")
    parser.add_argument("--demo", action="store_true", help="gpuflex demo's job and nodes")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.mode, args.demo)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
