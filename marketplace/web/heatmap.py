"""The operator's latency heatmap: estimated round-trip time between every pair of nodes.

Nodes only measure their link to the server (heartbeats carry `rtt_ms`), and all traffic
between nodes goes through the server, so the pair (a, b) costs a's RTT plus b's RTT. The
diagonal is a node's own RTT to the server. A pure function of the figures, for testing.
"""

from __future__ import annotations

from dataclasses import dataclass

# Colour scale end: links at or above this are drawn as bad as it gets.
WORST_MS = 400.0


@dataclass(frozen=True)
class Cell:
    ms: float | None
    level: int  # 0 (fast) to 9 (slow); -1 when a node has not reported its RTT


def level(ms: float | None) -> int:
    if ms is None:
        return -1
    return min(9, max(0, int(10 * ms / WORST_MS)))


def latency_matrix(rtts: list[float | None]) -> list[list[Cell]]:
    matrix = []
    for i, a in enumerate(rtts):
        row = []
        for j, b in enumerate(rtts):
            ms = None if a is None or b is None else round(a if i == j else a + b, 1)
            row.append(Cell(ms, level(ms)))
        matrix.append(row)
    return matrix
