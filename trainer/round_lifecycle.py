"""When a round closes: the one set of rules the marketplace and the simulator both apply.

A round's work is cut into units (a shard, or a silo's reserved task; in the simulator, a
participating node's update). A unit is *settled* when nothing more is to come for it, and
*usable* when it holds an accepted update to aggregate. The rules, in the order they apply:

- quorum: the round closes as soon as enough units are settled (`quorum_reached`); far
  nodes' two-round units are left out of the count when the others bring enough updates.
- deadline: at its deadline the round closes with the usable updates it has, if the
  strategy can aggregate that many (`at_deadline`); otherwise it waits one more deadline for
  the work still out (`extension_s`: never shorter than noticing a lost node takes), at most
  MAX_DEADLINES in all, and then gives up (the job fails saying why) unless work is still in
  flight on a live node: a lease is bounded (its expiry, its node's timeout, a task's
  attempts), so no round waits forever, and a node that is slow to start its first task (a
  GPU's CUDA start against a deadline planned from its speed) is not given up on mid-task.
- secure aggregation: a round that would close first holds until enough masked updates are
  in to unmask their sum without exposing anyone (`secure_hold`).
- late updates: work in flight at the close trains on when `rounds.late_updates: stale`
  says so, or when it is a far node's two-round task (`keeps_training`); the rest is
  cancelled (marketplace) or dropped (simulator).

A round's deadline and quorum come from the adaptation policy's RoundPlan when the round has
one (`deadline_s`, `Rules.for_spec(plan_quorum=...)`), else from the spec.

Failure detection: a node silent for NODE_TIMEOUT_S is offline and its lease goes back to
the queue, noticed on the next periodic tick (TICK_S). These are the marketplace's defaults
(GPUFLEX_NODE_TIMEOUT_S, GPUFLEX_TICK_S) and what the simulator assumes (FAILURE_DETECT_S).

Pure functions over plain values: no Django, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.spec import JobSpec

NODE_TIMEOUT_S = 45.0  # GPUFLEX_NODE_TIMEOUT_S's default
TICK_S = 5.0  # GPUFLEX_TICK_S's default: offline detection and overdue rounds run per tick
# The latest a vanished node's lease is given back: its timeout, then the next tick.
FAILURE_DETECT_S = NODE_TIMEOUT_S + TICK_S
ROUND_DEADLINE_S = 900.0  # GPUFLEX_ROUND_DEADLINE_S's default
# Deadlines a round that cannot aggregate waits through before its job fails: long enough
# for work lost with a node to be leased again and done, short of forever.
MAX_DEADLINES = 4


@dataclass(frozen=True)
class Unit:
    settled: bool  # nothing more to come for it
    usable: bool  # an accepted update to aggregate
    far: bool = False  # nothing in yet, held by a far node for two rounds
    in_flight: bool = False  # leased to a node that is alive, its lease not expired, or its
    # upload received and waiting for the server's check


@dataclass(frozen=True)
class Rules:
    quorum: float  # rounds.quorum: the share of units that closes a round early
    min_updates: int  # the fewest updates the strategy can aggregate
    every_unit: bool = False  # a scoring round needs every unit's rows
    plan_quorum: int | None = None  # the adaptation plan's quorum (updates), when planned
    late_updates: str = "drop"

    @classmethod
    def for_spec(cls, spec: JobSpec, plan_quorum: int | None = None) -> Rules:
        from trainer.aggregation import min_updates

        return cls(
            quorum=spec.rounds.quorum,
            min_updates=min_updates(spec.aggregation),
            every_unit=spec.scoring,
            plan_quorum=plan_quorum,
            late_updates=spec.rounds.late_updates,
        )


class Verdict(StrEnum):
    CLOSE = "close"  # aggregate what the round has
    EXTEND = "extend"  # wait one more deadline for the work still out
    GIVE_UP = "give_up"  # MAX_DEADLINES passed without enough: the job fails


def deadline_s(spec: JobSpec, plan_deadline_s: float | None, default_s: float) -> float:
    """Seconds a round runs before its deadline: the plan's (already capped by the spec's
    `rounds.deadline_s`), else the spec's, else the marketplace's default."""
    if plan_deadline_s is not None:
        return plan_deadline_s
    return spec.rounds.deadline_s or default_s


def extension_s(period_s: float, detect_s: float = FAILURE_DETECT_S) -> float:
    """How long a round that could not close at its deadline waits again: its period, and
    never less than noticing a lost node and giving its lease back takes (`detect_s`), so
    that work lost with a node can be leased again and done. A plan's deadline of a second
    or two would otherwise give up on a round before any node could be known lost."""
    return max(period_s, detect_s)


def quorum_units(quorum: float, units: int) -> int:
    """How many of `units` must settle before a round closes on `quorum`."""
    return math.ceil(quorum * units - 1e-9)


def needed(rules: Rules, units: int) -> int:
    """Settled units that close the round early: the spec's share of them, and no fewer
    than the plan's quorum (counted in updates; a round with fewer units needs them all)."""
    need = quorum_units(rules.quorum, units)
    if rules.plan_quorum is not None:
        need = max(need, min(rules.plan_quorum, units))
    return need


def _settled_enough(rules: Rules, units: Sequence[Unit]) -> bool:
    return sum(u.settled for u in units) >= needed(rules, len(units))


def quorum_reached(units: Sequence[Unit], rules: Rules) -> bool:
    """The quorum of all units; or, when far nodes hold some for two rounds, the quorum of
    the others alone, as long as those bring enough updates to aggregate: a round never
    closes empty-handed only because its far work is out. A scoring round needs every unit."""
    if not units:
        return False
    if rules.every_unit:
        return all(u.settled for u in units)
    if _settled_enough(rules, units):
        return True
    on_time = [u for u in units if not u.far]
    if len(on_time) == len(units) or not on_time:
        return False
    usable = sum(u.settled and u.usable for u in on_time)
    return usable >= rules.min_updates and _settled_enough(rules, on_time)


def at_deadline(units: Sequence[Unit], rules: Rules, deadlines_passed: int) -> Verdict:
    """What a round does at its deadline (`deadlines_passed` counts this one). `units` are as
    they stand then: a unit still out with an accepted but unverified update counts usable.
    A scoring round closes only with every unit settled; any other closes with what it has
    once the strategy can aggregate that many. Otherwise it waits another deadline, up to
    MAX_DEADLINES, and past them while any unit's work is still in flight."""
    if rules.every_unit:
        enough = bool(units) and all(u.settled for u in units)
    else:
        enough = sum(u.usable for u in units) >= rules.min_updates
    if enough:
        return Verdict.CLOSE
    if deadlines_passed < MAX_DEADLINES or any(u.in_flight for u in units):
        return Verdict.EXTEND
    return Verdict.GIVE_UP


def keeps_training(rules: Rules, *, far: bool) -> bool:
    """Whether work in flight at the close trains on (a later round folds its update in,
    FedBuff) rather than being cancelled or dropped."""
    return far or rules.late_updates == "stale"


def secure_hold(uploaded: int, threshold: int) -> bool:
    """A secure-aggregation round that would close holds while fewer masked updates are in
    than the threshold that unmasks their sum (unmasking fewer would expose them)."""
    return uploaded < threshold


def gave_up_reason(number: int, usable: int, rules: Rules) -> str:
    return (
        f"Round {number} had {usable} usable update(s) after {MAX_DEADLINES} deadlines; the "
        f"aggregation strategy needs {rules.min_updates}. Too few nodes finished its work."
    )
