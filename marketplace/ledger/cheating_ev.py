"""Whether cheating pays a node: expected profit of a cheater against an honest node's, from
the platform's rates (docs/money.md, "Cheating does not pay"). Pure Python: no Django, so the
verification bench (`cheat_ev_ratio`) and the documentation's numbers import it directly.

Units: one task's pay is 1. A node runs tasks back to back; an honest task costs it
`cost_share` (electricity, wear: what it spends per task, as a share of what the task pays).

The cheater's best cycle, per identity (a node caught once is replicated on every task from
then on, so the cheater's best move is a fresh node: the model is the cheater's best case):

1. probation: the first `probation_tasks` tasks of a new node are all replicated, so it works
   honestly: profit T (1 - c) each;
2. trusted: it cheats on a share f of its tasks, saving s of their cost. A share p of its
   tasks is checked (a replica, a spot check), and a check catches a cheated task with
   probability d, so each task is caught with q = p f d. Tasks until caught: N ~ Geometric(q).
   Every task but the caught one is paid (1 each), but at the catch the node forfeits the
   earnings of its unchecked tasks still inside the hold: those among its last
   min(N - 1, k) tasks, k = tasks it completes in one hold window (PAYOUT_HOLD_S / task time).
   Checked tasks that passed were released at once (a replica agreed).

       paid      = (1 - q) / q
       forfeited = (1 - p) (1 - (1 - q)^k) / q        (unchecked share of E[min(N-1, k)])
       cost      = c (1 - s f) / q
       cheater   = [T (1 - c) + paid - forfeited - cost] / (T + 1 / q)      per task
       honest    = 1 - c                                                  per task
       ratio     = cheater / honest

The cheater's gain over honest work along one cycle (the probation cancels: it is honest
work on both sides) is  g(f) / q  with

       g(f) = c s f - p f d - (1 - p) (1 - (1 - p f d)^k)

so cheating pays iff g(f) > 0. g(0) = 0 and g is convex in f, so the cheater's best share
is one of the ends, and no share pays (ratio < 1 for every f) iff both

       k > (c s - p d) / ((1 - p) p d)                       (rare cheating, f -> 0)
       k > ln(1 - (c s - p d) / (1 - p)) / ln(1 - p d)       (cheating on every task)

The second grows without bound as c s -> 1: when a task's cost eats its whole pay, honest
work earns nothing and any kept cheat beats it, so no hold suffices; the hold has to be set
for the cost share the platform's prices leave providers (docs/money.md gives the table).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

# cheat shares the worst case is searched over: 1 %, 2 %, ... 100 % of a node's tasks
CHEAT_SHARES = tuple(i / 100 for i in range(1, 101))


@dataclass(frozen=True)
class Rates:
    """What the platform and the node's economics set (see the module's docstring)."""

    check_rate: float  # p: share of a trusted node's tasks checked (REPLICATION_SHARE)
    tasks_per_hold: int  # k: tasks the node completes within one PAYOUT_HOLD_S
    probation_tasks: int = 3  # T: a new node's tasks all replicated (TRUST_AFTER_VERIFIED)
    detection: float = 1.0  # d: chance a check catches a cheated task
    cost_share: float = 0.5  # c: an honest task's cost to the node / its pay
    saving: float = 1.0  # s: share of that cost a cheated task saves (1: no work at all)
    cheat_share: float = 1.0  # f: share of its tasks the cheater cheats on

    def __post_init__(self) -> None:
        for name in ("check_rate", "detection", "saving", "cheat_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]; got {value}")
        if not 0.0 <= self.cost_share < 1.0:
            raise ValueError(
                f"cost_share must be within [0, 1) (honest work must pay); got {self.cost_share}"
            )
        if self.tasks_per_hold < 0 or self.probation_tasks < 0:
            raise ValueError("tasks_per_hold and probation_tasks cannot be negative")


@dataclass(frozen=True)
class Outcome:
    honest: float  # an honest node's expected profit per task
    cheater: float  # a cheater's, over its best cycle
    ratio: float  # cheater / honest: below 1, cheating does not pay

    @property
    def pays(self) -> bool:
        return self.ratio >= 1.0


def expected(rates: Rates) -> Outcome:
    """The closed form of the module's docstring."""
    c, s, f = rates.cost_share, rates.saving, rates.cheat_share
    honest = 1.0 - c
    q = rates.check_rate * f * rates.detection
    if q == 0.0:  # never caught: it keeps every task's pay and saves its cost
        cheater = 1.0 - c * (1.0 - s * f)
        return Outcome(honest, cheater, cheater / honest)
    t, p, k = rates.probation_tasks, rates.check_rate, rates.tasks_per_hold
    paid = (1.0 - q) / q
    forfeited = (1.0 - p) * (1.0 - (1.0 - q) ** k) / q
    cost = c * (1.0 - s * f) / q
    cheater = (t * honest + paid - forfeited - cost) / (t + 1.0 / q)
    return Outcome(honest, cheater, cheater / honest)


def cheat_ev_ratio(rates: Rates) -> float:
    """The worst case over how often the cheater cheats: the largest ratio over
    CHEAT_SHARES (the cheater picks its share). Below 1: no share of cheating pays."""
    return max(expected(replace(rates, cheat_share=f)).ratio for f in CHEAT_SHARES)


def break_even_tasks(rates: Rates, limit: int = 10**6) -> int | None:
    """The fewest tasks per hold window at which no cheat share pays (ratio < 1); None if
    even `limit` tasks do not suffice (no checks, say)."""
    lo, hi = 0, limit
    if cheat_ev_ratio(replace(rates, tasks_per_hold=hi)) >= 1.0:
        return None
    while lo < hi:  # the ratio falls as the hold covers more tasks
        mid = (lo + hi) // 2
        if cheat_ev_ratio(replace(rates, tasks_per_hold=mid)) < 1.0:
            hi = mid
        else:
            lo = mid + 1
    return lo


def break_even_closed(rates: Rates) -> int | None:
    """The fewest tasks per hold at which no share of cheating pays, from the two
    conditions of the module's docstring; None if no hold suffices. Agrees with
    `break_even_tasks`, which searches instead."""
    c_s = rates.cost_share * rates.saving
    pd = rates.check_rate * rates.detection
    if pd == 0.0:
        return None
    gain = c_s - pd  # what one cheated task saves beyond the pay a catch costs at once
    if gain < 0:  # at 0 a cheat breaks even without a hold (ratio 1): one task held is needed
        return 0
    rare = gain / ((1.0 - rates.check_rate) * pd)
    left = 1.0 - gain / (1.0 - rates.check_rate)
    if left <= 0 or pd >= 1.0:
        return None if left <= 0 else math.floor(rare) + 1
    every = math.log(left) / math.log(1.0 - pd)
    return math.floor(max(rare, every)) + 1


def simulate(rates: Rates, tasks: int, seed: int = 0) -> Outcome:
    """The same cycle played task by task (for the tests and the bench: the closed form must
    agree with it). Holds are counted in tasks: the unchecked paid tasks among the node's
    last `tasks_per_hold` trusted tasks."""
    rng = random.Random(seed)
    c, s, p = rates.cost_share, rates.saving, rates.check_rate
    profit = 0.0
    probation = rates.probation_tasks
    held: list[tuple[int, float]] = []  # (task index, pay) of unchecked tasks still held
    trusted_index = 0
    for _ in range(tasks):
        if probation > 0:  # every task replicated: honest
            probation -= 1
            profit += 1.0 - c
            continue
        trusted_index += 1
        cheat = rng.random() < rates.cheat_share
        checked = rng.random() < p
        profit -= c * (1.0 - s) if cheat else c
        if cheat and checked and rng.random() < rates.detection:
            # caught: no pay for it, every held earning forfeited, a new identity
            profit -= sum(pay for _, pay in held)
            held.clear()
            probation, trusted_index = rates.probation_tasks, 0
            continue
        profit += 1.0
        if not checked:
            held.append((trusted_index, 1.0))
        while held and held[0][0] <= trusted_index - rates.tasks_per_hold:
            held.pop(0)  # past the hold: the node's to keep
    honest = 1.0 - c
    cheater = profit / tasks
    return Outcome(honest, cheater, cheater / honest)


def doc_table(
    check_rate: float, probation_tasks: int, hold_s: float, task_s: tuple[float, ...]
) -> list[tuple[float, int, float]]:
    """(task seconds, tasks per hold, worst-case ratio) rows for docs/money.md."""
    rows = []
    for seconds in task_s:
        k = int(hold_s // seconds)
        ratio = cheat_ev_ratio(Rates(check_rate, k, probation_tasks))
        rows.append((seconds, k, ratio))
    return rows


if __name__ == "__main__":  # the numbers docs/money.md quotes, at the default settings
    p, trust, hold = 0.25, 3, 7 * 24 * 3600.0  # GPUFLEX_SEGMENT_CHECK_SHARE, TRUST_AFTER_VERIFIED
    base = Rates(check_rate=p, tasks_per_hold=0, probation_tasks=trust)
    print(f"no hold: worst-case ratio {cheat_ev_ratio(base):.3f}")
    for c_share in (0.25, 0.5, 0.75, 0.9):
        r = replace(base, cost_share=c_share)
        print(
            f"cost share {c_share}: break-even tasks per hold {break_even_tasks(r)} "
            f"(closed form {break_even_closed(r)}), no hold {cheat_ev_ratio(r):.3f}"
        )
    for seconds, k, ratio in doc_table(p, trust, hold, (300, 3600, 86400 / 2, 86400)):
        print(f"one task every {seconds:.0f} s: k = {k}, worst-case ratio {ratio:.3f}")
