"""What secure aggregation costs a round (`python -m bench.run --only privacy`).

An in-process simulation of the protocol (trainer/secagg/simulate.py: every node's side and
the server's, the same code the agents and the marketplace run, messages sized as the agent
API encodes them) against a plain round in the same process: each node encodes its update
as safetensors float32 and the server decodes and sums them. The update is the digits MLP's
(hidden 128: 9,610 weights) filled with synthetic values (the cost does not depend on them);
20 % of the nodes drop after sharing their keys, so the server also rebuilds their masks.
Times are compute only (no network, no training); bytes are what one node sends and receives
in the round besides the model download, which is the same for both.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np

SIZES = (8, 32, 100)
DROP = 0.2
WEIGHTS = 64 * 128 + 128 + 128 * 10 + 10
CLIP = 8.0


def _plain(vectors: list[np.ndarray]) -> dict[str, float]:
    import torch

    from trainer.updates import decode_state, encode_state

    node_s, payloads = [], []
    for v in vectors:
        t0 = time.perf_counter()
        payloads.append(encode_state({"w": torch.from_numpy(v.astype(np.float32))}))
        node_s.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    total = sum(decode_state(p)[0]["w"].double() for p in payloads)
    server_s = time.perf_counter() - t0
    assert total is not None
    return {"node_s": statistics.mean(node_s), "server_s": server_s,
            "round_s": max(node_s) + server_s, "up": float(len(payloads[0])),
            "down": 0.0}  # fmt: skip


def _secure(vectors: list[np.ndarray]) -> dict[str, float]:
    from trainer.secagg.simulate import run_round

    n = len(vectors)
    drop = set(range(n - math.ceil(DROP * n) + 1, n + 1))
    sim = run_round(vectors, CLIP, drop=drop)
    expected = sum(vectors[i - 1] for i in sim.survivors)
    assert np.abs(sim.total - expected).max() < 1e-3  # the unmasked sum is the sum
    return {"node_s": statistics.mean(sim.node_s), "server_s": sim.server_s,
            "round_s": max(sim.node_s) + sim.server_s, "dropped": len(sim.dropped),
            "up": statistics.mean(sim.up), "down": statistics.mean(sim.down)}  # fmt: skip


def run_scaling() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    _plain([rng.normal(0.0, 0.05, WEIGHTS) for _ in range(2)])  # imports and first calls
    rows = []
    for n in SIZES:
        vectors = [rng.normal(0.0, 0.05, WEIGHTS) for _ in range(n)]
        plain, secure = _plain(vectors), _secure(vectors)
        rows.append({
            "nodes": n, "dropped": secure.pop("dropped"), "plain": plain, "secure": secure,
            "time_ratio": secure["round_s"] / plain["round_s"],
            "bytes_ratio": (secure["up"] + secure["down"]) / (plain["up"] + plain["down"]),
        })  # fmt: skip
    return rows


def render_scaling(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        f"### Secure aggregation round vs plain round ({WEIGHTS:,} weights, 20 % dropping "
        "after sharing; in-process simulation, compute only)",
        "",
        "| nodes | dropped | plain: node ms | plain: server ms | plain: bytes/node | "
        "secagg: node ms | secagg: server ms | secagg: bytes up/node | secagg: bytes down/node "
        "| round time × plain | bytes × plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, s = r["plain"], r["secure"]
        lines.append(
            f"| {r['nodes']} | {r['dropped']} | {1e3 * p['node_s']:.2f} | "
            f"{1e3 * p['server_s']:.1f} | {p['up']:,.0f} | {1e3 * s['node_s']:.1f} | "
            f"{1e3 * s['server_s']:.0f} | {s['up']:,.0f} | {s['down']:,.0f} | "
            f"{r['time_ratio']:.0f} | {r['bytes_ratio']:.2f} |"
        )
    lines += [
        "",
        "Flower's SecAgg+ (the anchor): its documentation (SecAggPlusWorkflow) gives the "
        "protocol's parameters (clipping_range 8.0, quantization_range 2^22, modulus_range "
        "2^32, max_weight 1000) but no published timings or byte counts that we found; no "
        "Flower figure is shown here rather than an invented one.",
    ]
    return lines
