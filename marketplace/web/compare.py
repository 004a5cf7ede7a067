"""The comparison page's data: network-aware against naive training, from `make bench`.

`bench/results/results.json` is written by `bench/run.py`; this module only reads it and
reshapes it for the charts. A missing or older file gives an empty page, never an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "results.json"
METHODS = [("naive_sync", "Naive sync"), ("fedavg", "Plain FedAvg"),
           ("network_aware", "Network-aware")]  # fmt: skip
SCENARIOS = [("mlp_wan", "MLP on a WAN"), ("cnn_wan", "CNN on a WAN")]


def load_results(path: Path = RESULTS) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data.get("network"), dict) else None


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _scenario(raw: dict[str, Any], key: str, title: str) -> dict[str, Any] | None:
    if not all(m in raw for m, _ in METHODS):
        return None
    methods = []
    for name, label in METHODS:
        r = raw[name]
        methods.append(
            {
                "key": name,
                "label": label,
                "time_to_target_s": r.get("time_to_target_s"),
                "rounds_to_target": r.get("rounds_to_target"),
                "up_per_node": _bytes(r.get("bytes_up_per_node_to_target") or 0),
                "utilization": r.get("utilization"),
                "idle_fraction": r.get("idle_fraction"),
                "final_accuracy": r.get("final_accuracy"),
                # one (time, accuracy) point per round: the accuracy-over-time chart
                "times": r.get("sim_time_per_round") or [],
                "accuracy": r.get("accuracy_per_round") or [],
            }
        )
    naive = methods[0]["time_to_target_s"]
    aware = methods[-1]["time_to_target_s"]
    return {
        "key": key,
        "title": title,
        "nodes": raw.get("nodes"),
        "network": raw.get("network"),
        "methods": methods,
        "speedup": (naive / aware) if naive and aware else None,
    }


def chart_data(results: dict[str, Any]) -> dict[str, Any]:
    network = results["network"]
    scenarios = [
        s for key, title in SCENARIOS if (s := _scenario(network.get(key) or {}, key, title))
    ]
    return {
        "scenarios": scenarios,
        "hetero": network.get("hetero"),
        "flaky": network.get("flaky"),
        "machine": results.get("machine", ""),
    }
