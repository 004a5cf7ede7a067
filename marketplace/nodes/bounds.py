"""What node-supplied figures may be: the one place the API's schemas, the database's
constraints, the read-side cleaning of stored figures and the data migration take their
bounds from. Plain Python (no Django, no DRF), so every layer can import it.

The limits are generous for real hardware and links (a node is a machine, not a data
centre) and small enough that no sum, product or float conversion of them can overflow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_MEMORY_GB = 16_384.0  # 16 TiB: more than any one machine's GPU or task memory
MAX_MEMORY_MB = MAX_MEMORY_GB * 1024
MAX_TFLOPS = 100_000.0
MAX_GBPS = 100_000.0
MAX_SAMPLES_PER_S = 1e9
MAX_RTT_MS = 600_000.0  # ten minutes: a link slower than that is no link
MAX_MBPS = 1_000_000.0  # 1 Tbit/s
MAX_TEMP_C = 200.0
MAX_PERCENT = 100.0
MAX_DATASET_ROWS = 1_000_000_000  # a federated update's weight never exceeds this
MAX_LOCAL_DATASETS = 32
# a local dataset's advertised schema (desktop/local_datasets.py): never rows, only its shape
MAX_INPUT_DIMS = 4  # [features] for a table, [channels, height, width] for images
MAX_INPUT_DIM = 1_000_000
MAX_CLASSES = 100_000
MAX_SCHEMA_NAMES = 256  # column or class names advertised
MAX_DICT_KEYS = 16  # per-model or per-precision figures in a benchmark
MAX_GPUS = 16
MAX_NOTES = 16
SHORT_TEXT = 100
LONG_TEXT = 500

# the link figures a node reports (registration and heartbeats): name -> (min, max)
NETWORK_BOUNDS: dict[str, tuple[float, float]] = {
    "rtt_ms": (0.0, MAX_RTT_MS),
    "up_mbps": (0.0, MAX_MBPS),
    "down_mbps": (0.0, MAX_MBPS),
    "loss": (0.0, 1.0),
}

# the benchmark figures the marketplace computes with (speed factor, step time)
BENCHMARK_BOUNDS: dict[str, tuple[float, float]] = {
    "fp32_tflops": (0.0, MAX_TFLOPS),
    "fp16_tflops": (0.0, MAX_TFLOPS),
    "bf16_tflops": (0.0, MAX_TFLOPS),
    "memory_gbps": (0.0, MAX_GBPS),
    "h2d_gbps": (0.0, MAX_GBPS),
    "d2h_gbps": (0.0, MAX_GBPS),
}


def finite_in(value: Any, low: float, high: float) -> bool:
    """A real number (not a bool, not a string) within [low, high]."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


def clean_figures(raw: Any, bounds: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Only the figures that are numbers within their bounds; anything else is left out, as
    if the node had not reported it. For reading figures stored before they were validated:
    one node's bad value must never break another's claim or page."""
    if not isinstance(raw, Mapping):
        return {}
    return {
        key: float(raw[key])
        for key, (low, high) in bounds.items()
        if key in raw and finite_in(raw[key], low, high)
    }


def clean_throughput(value: Any) -> float | dict[str, float] | None:
    """`train_samples_per_s`: one figure or {model: figure}, only the valid ones kept."""
    if isinstance(value, Mapping):
        return {
            k: float(v)
            for k, v in list(value.items())[:MAX_DICT_KEYS]
            if isinstance(k, str) and finite_in(v, 0, MAX_SAMPLES_PER_S)
        }
    return float(value) if finite_in(value, 0, MAX_SAMPLES_PER_S) else None


def clean_benchmark(raw: Any) -> dict[str, Any]:
    """The benchmark figures that are valid (clean_figures), and its throughput."""
    out: dict[str, Any] = clean_figures(raw, BENCHMARK_BOUNDS)
    if isinstance(raw, Mapping) and "train_samples_per_s" in raw:
        throughput = clean_throughput(raw["train_samples_per_s"])
        if throughput is not None:
            out["train_samples_per_s"] = throughput
    return out
