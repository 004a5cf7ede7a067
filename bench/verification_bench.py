"""Verification (issue #35): honest results never flagged, each cheat caught, what checking
costs, and whether cheating pays.

    python -m bench.run --only verification
    python -m bench.verification_bench [--seeds N]    # the trials alone, printed

Honest and cheating uploads come from bench/verification_trials.py (real tasks through
train_local, the int8 round trip, the marketplace's agreement rule); an H200's honest replicas
against a CPU's come from bench/results/divergence-h200.json (bench/replica_divergence.py
--device cuda, run where a GPU was lent).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.verification_trials import CHEATS, Comparison, trials

ROOT = Path(__file__).resolve().parents[1]
GPU_ROWS = ROOT / "bench" / "results" / "divergence-h200.json"
TASKS_TO_CATCH = 20  # "caught within 20 tasks of starting" (issue #35)


def honest_gpu() -> list[dict[str, Any]]:
    """The H200 rows of the divergence bench: each a CPU replica against a CUDA one."""
    if not GPU_ROWS.exists():
        return []
    return [r for r in json.loads(GPU_ROWS.read_text()) if "cuda" in r["pair"] and not r["cheat"]]


def replica_trials(mlp_seeds: int, cnn_seeds: int) -> list[Comparison]:
    rows = list(trials("mlp", range(mlp_seeds)))
    rows += list(trials("cnn", range(100, 100 + cnn_seeds)))
    return rows


def summarize_replicas(rows: list[Comparison], gpu: list[dict[str, Any]]) -> dict[str, Any]:
    honest = [r for r in rows if not r.cheat]
    by_pair: dict[str, list[float]] = defaultdict(list)
    for r in honest:
        by_pair[r.what.removeprefix("honest ")].append(r.relative_l2)
    detect: dict[str, dict[str, Any]] = {}
    for name in CHEATS:
        picked = [r for r in rows if r.cheat and r.what == name]
        if not picked:
            continue
        detect[name] = {
            "trials": len(picked),
            "rejected": sum(not r.agreed for r in picked),
            "rejected_same_device_rule": sum(not r.agreed_same_device for r in picked),
            "closest": round(min(r.relative_l2 for r in picked), 4),
        }
    return {
        "honest": {
            "comparisons": len(honest) + len(gpu),
            "flagged": sum(not r.agreed for r in honest) + sum(not r["agreed"] for r in gpu),
            "cpu_comparisons": len(honest),
            "gpu_comparisons": len(gpu),
            "largest": round(
                max([r.relative_l2 for r in honest] + [g["relative_l2"] for g in gpu]), 4
            ),
            "by_pair": {k: {"n": len(v), "largest": round(max(v), 4)} for k, v in by_pair.items()},
            "gpu_largest": round(max((r["relative_l2"] for r in gpu), default=0.0), 4),
            # the same-device rule (SAME_DEVICE_TOLERANCE for equal claims) on fp32 against
            # fp64, a stand-in for fp32 on another device: why it is no rule for a mixed fleet
            "flagged_by_same_device_rule_across_devices": sum(
                not r.agreed_same_device for r in honest if r.what == "honest fp32/fp64"
            ),
        },
        "replica_detection": detect,
    }


def caught_within(per_check: float, check_share: float, tasks: int = TASKS_TO_CATCH) -> float:
    """The chance a node that cheats on every task is caught within `tasks` tasks, when each
    task is checked with probability `check_share` and a check catches it with `per_check`."""
    return 1.0 - (1.0 - check_share * per_check) ** tasks


CHECK_SHARE = 0.25  # GPUFLEX_SEGMENT_CHECK_SHARE's default: a trusted node's uploads checked
SEGMENTS = 4  # trainer.proof.DEFAULT_SEGMENTS
LIVE = ROOT / "bench" / "results" / "verification_live.json"


def segment_figures(shards: int) -> dict[str, Any]:
    from bench.segment_trials import binding_trials, trials

    rows = list(trials(shards))
    honest = [r for r in rows if not r.cheat]
    bind: dict[str, list[bool]] = defaultdict(list)
    for name, caught in binding_trials(shards):
        bind[name].append(caught)
    fp16 = [r for r in honest if r.prover == "honest_fp16"]
    detect = {
        name: {"trials": len(v), "per_check": round(sum(v) / len(v), 4), "how": "binding"}
        for name, v in bind.items() if name != "honest"
    }  # fmt: skip
    for name in ("half_steps", "wrong_shard"):
        picked = [r for r in rows if r.prover == name]
        detect[name] = {"trials": len(picked), "how": "segment re-run",
                        "per_check": round(sum(r.caught_share for r in picked) / len(picked), 4),
                        "closest": round(min(min(r.distances) for r in picked), 4)}  # fmt: skip
    # an fp16 run claimed as fp32 commits to fp16's loss scaler in every checkpoint after the
    # first (marketplace/proofs/worker.py): caught on each check while the state holds it
    detect["precision_claim"] = {"trials": len(fp16), "per_check": 1.0 if fp16 else 0.0,
                                 "how": "fp16 loss scaler in the committed state"}  # fmt: skip
    return {
        "honest_segments": sum(len(r.distances) for r in honest),
        "honest_flagged": sum(d > r.tolerance for r in honest for d in r.distances),
        "honest_largest": round(max(max(r.distances) for r in honest), 4),
        "honest_binding": len(bind["honest"]),
        "honest_binding_flagged": sum(bind["honest"]),
        "detection": detect,
    }


def run(mlp_seeds: int = 25, cnn_seeds: int = 10, shards: int = 4) -> dict[str, Any]:
    from marketplace.ledger.cheating_ev import Rates, cheat_ev_ratio

    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = replica_trials(mlp_seeds, cnn_seeds)
    out = summarize_replicas(rows, honest_gpu())
    seg = segment_figures(shards)
    out["segments"] = seg
    honest = out["honest"]
    comparisons = honest["comparisons"] + seg["honest_segments"] + seg["honest_binding"]
    flagged = honest["flagged"] + seg["honest_flagged"] + seg["honest_binding_flagged"]
    out["honest_flagged"] = {"flagged": flagged, "of": comparisons}
    caught, smart = {}, {}
    for name in CHEATS:
        d = seg["detection"][name]["per_check"]
        caught[name] = round(caught_within(d, CHECK_SHARE), 4)
        # a cheater that fabricates one segment's checkpoints to match its upload is caught
        # only when that segment is drawn: 1 in SEGMENTS of the checks
        smart[name] = round(caught_within(d / SEGMENTS, CHECK_SHARE), 4)
    out["caught"] = caught
    out["caught_one_segment_fabricated"] = smart
    out["caught_on_probation"] = {n: round(caught_within(seg["detection"][n]["per_check"], 1.0), 4)
                                  for n in CHEATS}  # fmt: skip
    worst = min(seg["detection"][n]["per_check"] for n in CHEATS)
    ev_rates = Rates(check_rate=CHECK_SHARE, tasks_per_hold=14, probation_tasks=3,
                     detection=worst)  # fmt: skip
    out["cheat_ev_ratio"] = round(cheat_ev_ratio(ev_rates), 4)
    out["cheat_ev_rates"] = {"check_rate": CHECK_SHARE, "tasks_per_hold": 14,
                             "probation_tasks": 3, "detection": worst, "cost_share": 0.5,
                             "note": "7-day hold, 2 tasks a day (docs/money.md)"}  # fmt: skip
    live = json.loads(LIVE.read_text()) if LIVE.exists() else None
    out["live"] = live
    out["overhead"] = live["overhead"] if live else None
    out["trials_s"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=25, help="MLP seeds (the CNN gets 2/5)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.seeds, max(1, args.seeds * 2 // 5)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def render(v: dict[str, Any]) -> list[str]:
    h, seg, live = v["honest"], v["segments"], v.get("live")
    rows = []
    for name in CHEATS:
        d = seg["detection"][name]
        rep = v["replica_detection"].get(name)
        rep_s = f"{rep['rejected']}/{rep['trials']}" if rep else "—"
        rows.append(
            f"| {name} | {d['how']} | {d['per_check']:.2f} ({d['trials']}) | {rep_s} | "
            f"**{v['caught'][name]:.4f}** | {v['caught_one_segment_fabricated'][name]:.3f} |"
        )
    over = "not measured"
    if live:
        over = (f"**{live['overhead']:.3f}** ({live['rerun_steps']} steps re-run and "
                f"{live['replica_steps']} replica steps against {live['primary_steps']} steps "
                f"of {live['primary_tasks']} tasks; {live['checks']} segment checks; "
                f"{live['nodes']} agents, {live['cheaters']} cheating, {live['rounds']} rounds; "
                f"job {live['job_status']}, {live['wall_s']:.0f} s)")  # fmt: skip
    return [
        "## Verification (issue #35)",
        "",
        "`python -m bench.run --only verification` (bench/verification_bench.py; the overhead "
        "from `python -m bench.verification_live`).",
        "",
        "| figure | measured | goal |",
        "|---|---|---|",
        f"| verification compute / useful compute, steady state, {live['nodes'] if live else 20}"
        f" nodes, 5 % cheaters | {over} | ≤ 0.10 |",
        f"| honest results flagged (fp32/bf16/fp16; CPU, and a CPU against an H200) | "
        f"**{v['honest_flagged']['flagged']} in {v['honest_flagged']['of']:,}** "
        f"({h['comparisons']:,} replica pairs, {h['gpu_comparisons']} of them CPU/H200; "
        f"{seg['honest_segments']} segment re-runs; {seg['honest_binding']} bindings) | "
        "0 in ≥ 1,000 |",
        f"| expected earnings of a cheating node / an honest one | **{v['cheat_ev_ratio']:.3f}** "
        f"(7-day hold, 2 tasks a day, a task costing half its pay, the weakest detection) | < 1 |",
        "",
        f"Each cheat, caught within 20 tasks of a trusted node starting to cheat, its uploads "
        f"checked at {CHECK_SHARE:.0%} (a node on probation has every upload checked: "
        "caught at its first check). Per check: the share of checks that reject it, from "
        "real tasks; replicas: the same cheat against an honest replica by the replica rule "
        "(tasks that cannot commit to a chain). Last column: a cheater that fabricates one "
        "segment's checkpoints to match its upload, caught only when that segment is drawn.",
        "",
        "| cheat | caught by | per check (trials) | replicas rejected | caught within 20 "
        "tasks (goal ≥ 0.99) | one segment fabricated |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Largest honest distances: replicas {h['largest']:.3f} (CPU against an H200 "
        f"{h['gpu_largest']:.3f}), segment re-runs {seg['honest_largest']:.3f}; the rule's "
        "tolerance 0.25. The same-device rule (1e-3 for equal claims) would flag "
        f"{h['flagged_by_same_device_rule_across_devices']} of "
        f"{h['by_pair'].get('fp32/fp64', {}).get('n', 0)} honest fp32 replicas of another "
        "summation order: it is for a fleet of one kind of device only.",
        "",
    ]
