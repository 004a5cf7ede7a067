"""Fixed costs (trainer.sim.network.FixedCosts) measured from a real run's own timestamps, so
the simulator's prediction of that run assumes what the system spent, not a bench's medians
from another workload.

Per round, from the server's clock: the round opened at `opened`; its updates arrived at
`arrivals` (each with the compute its node reported); the round closes on the update that
makes its quorum (as trainer.round_lifecycle closes it) and the next round opens at
`next_opened` (the last round: the job's end, its aggregation done). Then

    task_s  = closing update's arrival - opened - its compute   (claim wait, download, upload,
              sandbox and agent overhead: all a task spends besides computing)
    round_s = next_opened - closing update's arrival            (queue wait, aggregation,
              evaluation, opening the next round)

averaged over the rounds (the mean, not the median: the simulator adds them up round by round,
and a first round's warm-up is part of what the real run spent). The lan transfers the
simulator charges besides (milliseconds) are counted twice; nothing else is.

Plain values only: no Django, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainer.round_lifecycle import quorum_units
from trainer.sim.network import FixedCosts


@dataclass(frozen=True)
class RoundTimes:
    opened: float  # seconds on the server's clock
    arrivals: tuple[tuple[float, float], ...]  # (update received, its reported compute_s)
    next_opened: float
    units: int  # the round's tasks


def closing(times: RoundTimes, quorum: float) -> tuple[float, float] | None:
    """The update whose arrival made the round's quorum (the last one if fewer came)."""
    if not times.arrivals:
        return None
    ordered = sorted(times.arrivals)
    need = max(quorum_units(quorum, times.units), 1)
    return ordered[min(need, len(ordered)) - 1]


def measured_costs(rounds: Sequence[RoundTimes], quorum: float) -> FixedCosts | None:
    """The run's mean fixed costs per task and per round; None without a round to measure."""
    tasks, gaps = [], []
    for r in rounds:
        close = closing(r, quorum)
        if close is None:
            continue
        at, compute = close
        tasks.append(max(at - r.opened - compute, 0.0))
        gaps.append(max(r.next_opened - at, 0.0))
    if not tasks:
        return None
    return FixedCosts(task_s=sum(tasks) / len(tasks), round_s=sum(gaps) / len(gaps))
