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


def run(mlp_seeds: int = 25, cnn_seeds: int = 10) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = replica_trials(mlp_seeds, cnn_seeds)
    out = summarize_replicas(rows, honest_gpu())
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
