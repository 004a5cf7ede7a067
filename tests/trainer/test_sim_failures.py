"""The simulator's failure model as the promises bench injects failures (exactly k nodes a
round, restarted and resuming, or gone and detected as the marketplace detects them), and
fixed costs measured from a real run's own timestamps (trainer.sim.measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.sim.failures import Failures
from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.measured import RoundTimes, closing, measured_costs
from trainer.sim.network import NO_FIXED_COSTS, FixedCosts
from trainer.sim.setup import prepare
from trainer.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits-mlp.yaml"
THREE_ROUNDS = RunOptions(max_rounds=3, stop_at_target=False)


@pytest.fixture(scope="module")
def spec():
    return load_spec(DIGITS)


def _run(spec, quorum: float, failures: Failures | None):
    quorum_spec = spec.replace(rounds=spec.rounds.model_dump(mode="json") | {"quorum": quorum})
    setup = prepare(quorum_spec, 5, "lan", 0, costs=NO_FIXED_COSTS)
    setup.failures = failures
    result, _ = run_federated(setup, THREE_ROUNDS)
    return result


def test_exactly_k_nodes_fail_every_round_and_the_same_ones_on_a_rerun() -> None:
    f = Failures(per_round=2)
    picks = [f.victims(10, seed=0, round_=r) for r in range(1, 30)]
    assert all(len(p) == 2 and p <= set(range(10)) for p in picks)
    assert len(set(picks)) > 1  # not the same two nodes every round
    assert picks == [f.victims(10, seed=0, round_=r) for r in range(1, 30)]
    assert Failures(per_round=7).victims(3, 0, 1) == {0, 1, 2}


@pytest.mark.parametrize(
    "kwargs",
    [{"per_round": -1}, {"per_round": 1, "back_after_s": -2.0},
     {"per_round": 1, "detect_s": float("inf")}, {"per_round": 1, "at": 1.5}],
)  # fmt: skip
def test_a_senseless_failure_model_is_refused(kwargs) -> None:
    with pytest.raises(ValueError, match="must be"):
        Failures(**kwargs)


def test_a_round_closing_on_its_quorum_does_not_wait_for_the_failed(spec) -> None:
    """Two of five fail, three are needed (quorum 0.6): every round closes on the three
    others, as fast as without failures, whether the failed come back or are gone."""
    none = _run(spec, 0.6, None)
    for failures in (Failures(per_round=2, back_after_s=30.0), Failures(per_round=2)):
        failed = _run(spec, 0.6, failures)
        assert [log.dropped for log in failed.log] == [2, 2, 2]
        assert [log.participants for log in failed.log] == [3, 3, 3]
        assert failed.sim_wall_s == pytest.approx(none.sim_wall_s)


def test_a_round_that_needs_the_failed_waits_for_their_restart_or_their_detection(spec) -> None:
    """Quorum 1.0: a restarted node's update arrives `back_after_s` late and is used; a gone
    node is noticed after `detect_s` (the node timeout, then a tick) and the round closes
    without it."""
    none = _run(spec, 1.0, None)
    back = _run(spec, 1.0, Failures(per_round=1, back_after_s=30.0))
    gone = _run(spec, 1.0, Failures(per_round=1, detect_s=25.0))
    for log, base in zip(back.log, none.log, strict=True):
        assert log.participants == 5
        assert log.round_s >= base.round_s + 30.0
    for log in gone.log:
        assert log.participants == 4 and log.round_s >= 25.0


def test_fixed_costs_come_from_the_closing_update_and_the_next_opening() -> None:
    """Round one opens at 0; of its four tasks, three (quorum 0.75) close it: the third
    arrival, at 12 s with 8 s of compute, leaves 4 s of task cost; the next round opens 1 s
    later. Costs are the means over rounds."""
    rounds = [
        RoundTimes(opened=0.0, arrivals=((10.0, 8.0), (11.0, 8.0), (12.0, 8.0), (30.0, 8.0)),
                   next_opened=13.0, units=4),
        RoundTimes(opened=13.0, arrivals=((22.0, 8.0), (23.0, 8.0), (50.0, 8.0)),
                   next_opened=26.0, units=4),
    ]  # fmt: skip
    assert closing(rounds[0], 0.75) == (12.0, 8.0)
    assert closing(rounds[1], 0.75) == (50.0, 8.0)  # its third arrival, late as it was
    costs = measured_costs(rounds[:1], 0.75)
    assert costs == FixedCosts(task_s=4.0, round_s=1.0)
    few = RoundTimes(opened=13.0, arrivals=((22.0, 8.0),), next_opened=26.0, units=4)
    # fewer updates than the quorum: the last one closed the round (at its deadline); its
    # task cost 22 - 13 - 8 = 1 s, its gap 4 s
    assert measured_costs([rounds[0], few], 0.75) == FixedCosts(task_s=2.5, round_s=2.5)
    assert measured_costs([], 0.75) is None
    assert measured_costs([RoundTimes(0.0, (), 5.0, 4)], 0.75) is None
