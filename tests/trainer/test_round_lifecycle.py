"""trainer.round_lifecycle: the rules that close a round, for the marketplace and simulator."""

import pytest

from trainer import round_lifecycle as rl

IN = rl.Unit(settled=True, usable=True)
OUT = rl.Unit(settled=False, usable=False)
FAR = rl.Unit(settled=False, usable=False, far=True)
EMPTY = rl.Unit(settled=True, usable=False)  # settled with nothing usable (rejected)


def rules(quorum: float = 1.0, min_updates: int = 1, **kw) -> rl.Rules:
    return rl.Rules(quorum=quorum, min_updates=min_updates, **kw)


def test_quorum_counts_settled_units() -> None:
    assert rl.quorum_reached([IN, IN, IN, IN], rules())
    assert not rl.quorum_reached([IN, IN, IN, OUT], rules())
    assert rl.quorum_reached([IN, IN, IN, OUT], rules(0.75))
    assert not rl.quorum_reached([], rules())


def test_the_plans_quorum_is_applied_and_never_lowers_the_specs() -> None:
    # the plan asks for 3 updates where the spec's 0.5 of 4 units would be 2
    assert not rl.quorum_reached([IN, IN, OUT, OUT], rules(0.5, plan_quorum=3))
    assert rl.quorum_reached([IN, IN, IN, OUT], rules(0.5, plan_quorum=3))
    # a plan quorum above the units needs them all, not the impossible
    assert rl.quorum_reached([IN, IN], rules(0.5, plan_quorum=5))
    # the spec's 1.0 stands against a smaller plan quorum (units are shards, not nodes)
    assert not rl.quorum_reached([IN, IN, OUT], rules(1.0, plan_quorum=2))


def test_far_units_are_not_waited_for_when_the_others_can_be_aggregated() -> None:
    assert rl.quorum_reached([IN, IN, FAR], rules())
    assert not rl.quorum_reached([EMPTY, FAR], rules())  # never closes empty-handed
    assert not rl.quorum_reached([IN, FAR], rules(min_updates=2))
    assert not rl.quorum_reached([FAR, FAR], rules())


def test_a_scoring_round_needs_every_unit() -> None:
    assert not rl.quorum_reached([IN, IN, FAR], rules(every_unit=True))
    assert rl.at_deadline([IN, OUT], rules(every_unit=True), 1) is rl.Verdict.EXTEND
    assert rl.at_deadline([IN, EMPTY], rules(every_unit=True), 1) is rl.Verdict.CLOSE


def test_at_the_deadline_a_round_closes_with_what_it_can_aggregate() -> None:
    assert rl.at_deadline([IN, OUT, OUT], rules(), 1) is rl.Verdict.CLOSE
    assert rl.at_deadline([IN, OUT, OUT], rules(min_updates=2), 1) is rl.Verdict.EXTEND


@pytest.mark.parametrize("passed", range(1, rl.MAX_DEADLINES + 3))
def test_no_round_waits_forever(passed: int) -> None:
    verdict = rl.at_deadline([OUT, OUT], rules(), passed)
    want = rl.Verdict.EXTEND if passed < rl.MAX_DEADLINES else rl.Verdict.GIVE_UP
    assert verdict is want


@pytest.mark.parametrize("passed", range(rl.MAX_DEADLINES, rl.MAX_DEADLINES + 3))
def test_past_its_deadlines_a_round_waits_only_for_work_in_flight(passed: int) -> None:
    working = rl.Unit(settled=False, usable=False, in_flight=True)
    assert rl.at_deadline([OUT, working], rules(), passed) is rl.Verdict.EXTEND
    assert rl.at_deadline([OUT, OUT], rules(), passed) is rl.Verdict.GIVE_UP


def test_a_round_waits_again_no_shorter_than_noticing_a_lost_node_takes() -> None:
    assert rl.extension_s(900.0) == 900.0
    assert rl.extension_s(1.5) == rl.FAILURE_DETECT_S
    assert rl.extension_s(1.5, detect_s=9.0) == 9.0


def test_late_work_trains_on_only_when_stale_or_far() -> None:
    assert rl.keeps_training(rules(late_updates="stale"), far=False)
    assert rl.keeps_training(rules(), far=True)
    assert not rl.keeps_training(rules(), far=False)


def test_secure_rounds_hold_until_the_threshold_is_in() -> None:
    assert rl.secure_hold(2, 3)
    assert not rl.secure_hold(3, 3)


def test_the_deadline_is_the_plans_else_the_specs_else_the_default() -> None:
    from pathlib import Path

    from trainer.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.yaml")
    spec = spec.replace(rounds={**spec.rounds.model_dump(mode="json"), "deadline_s": None})
    assert rl.deadline_s(spec, 12.0, 900.0) == 12.0
    assert rl.deadline_s(spec, None, 900.0) == 900.0
    timed = spec.replace(rounds={**spec.rounds.model_dump(mode="json"), "deadline_s": 60.0})
    assert rl.deadline_s(timed, None, 900.0) == 60.0


def test_the_marketplace_defaults_are_what_the_simulator_assumes() -> None:
    from marketplace.server.settings.environment import BY_NAME

    assert BY_NAME["GPUFLEX_NODE_TIMEOUT_S"].default == rl.NODE_TIMEOUT_S
    assert BY_NAME["GPUFLEX_TICK_S"].default == rl.TICK_S
    assert BY_NAME["GPUFLEX_ROUND_DEADLINE_S"].default == rl.ROUND_DEADLINE_S
    assert rl.FAILURE_DETECT_S == rl.NODE_TIMEOUT_S + rl.TICK_S
