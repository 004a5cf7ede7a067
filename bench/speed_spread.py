"""The honest spread of a task's compute seconds, which the speed check's margin must clear
(docs/money.md, "Speed"): one small training task timed again and again on this machine.

    python -m bench.speed_spread [repeats]

prints sigma of log(seconds) and the slowest / fastest and slowest / median ratios, as JSON.
A ratio and a spread, never a time: they compare across machines.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time

import torch


def task(steps: int = 300, batch: int = 32) -> float:
    """Seconds one small MLP task (the same data, the same steps) takes to train."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 64, generator=gen)
    y = torch.randint(0, 10, (2048,), generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = time.perf_counter()
    for step in range(steps):
        i = (step * batch) % 2048
        loss = torch.nn.functional.cross_entropy(model(x[i : i + batch]), y[i : i + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def spread(repeats: int = 80) -> dict[str, float]:
    torch.set_num_threads(1)  # one task per core, as a busy node runs it
    task()  # warm: the first run pays for allocation and dispatch caches
    times = [task() for _ in range(repeats)]
    logs = [math.log(t) for t in times]
    med = statistics.median(times)
    return {
        "repeats": repeats,
        "sigma_log": round(statistics.stdev(logs), 4),
        "slowest_over_fastest": round(max(times) / min(times), 3),
        "slowest_over_median": round(max(times) / med, 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(spread(int(args[0]) if args else 80)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
