"""Network-aware rounds in the simulator: deadlines, quorums, staleness and the end result."""

from pathlib import Path

import pytest

from trainer.adapt import RoundPlan, plan_round
from trainer.sim.adaptive import NetworkAwareRun, staleness_weight
from trainer.sim.compare import compare, network_aware_variant, plain_variant
from trainer.sim.nodes import InFlight
from trainer.sim.setup import prepare
from trainer.spec import load_spec

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.yaml"


@pytest.fixture(scope="module")
def spec():
    # small local work keeps the test fast; the benchmark runs the full-size policy
    base = load_spec(DIGITS)
    return network_aware_variant(base).replace(adaptation={"enabled": True, "max_local_steps": 150})


def _run(spec, network="wan", nodes=4, **rounds) -> NetworkAwareRun:
    if rounds:
        spec = spec.replace(rounds={**spec.rounds.model_dump(mode="json"), **rounds})
    return NetworkAwareRun(prepare(spec, nodes, network, 0))


def _plan(deadline: float, quorum: int) -> RoundPlan:
    return RoundPlan(round_s=deadline, deadline_s=deadline, quorum=quorum, nodes={})


def _job(arrival: float | None, sent: float = 0.0, version: int = 0, two_rounds=False):
    return InFlight(version, sent, arrival, b"", 1, 0.0, two_rounds)


def test_staleness_weights_follow_fedbuff() -> None:
    assert staleness_weight(0) == 1.0
    assert staleness_weight(3) == pytest.approx(0.5)


def test_round_closes_when_everyone_is_in_before_the_deadline(spec) -> None:
    run = _run(spec, quorum=1.0)
    for node, arrival in zip(run.nodes, (1.0, 2.0, 3.0, 2.5), strict=True):
        node.job = _job(arrival)
    assert run.close_time(_plan(10.0, 4), start=0.0) == 3.0


def test_round_closes_at_the_deadline_with_what_came(spec) -> None:
    # the marketplace's rule (trainer.round_lifecycle): at the deadline the round aggregates
    # what it has once the strategy can aggregate that many, whatever the quorum
    run = _run(spec, quorum=1.0)
    for node, arrival in zip(run.nodes, (1.0, 2.0, 30.0, 40.0), strict=True):
        node.job = _job(arrival)
    assert run.close_time(_plan(10.0, 2), start=0.0) == 10.0
    assert run.close_time(_plan(10.0, 3), start=0.0) == 10.0


def test_nothing_in_by_the_deadline_waits_one_more_then_gives_up(spec) -> None:
    run = _run(spec, quorum=1.0)
    for node, arrival in zip(run.nodes, (15.0, None, None, None), strict=True):
        node.job = _job(arrival)
    # nothing by 10 s: one more deadline, never shorter than noticing a lost node takes
    # (FAILURE_DETECT_S, 50 s); the update that came at 15 s is aggregated then
    assert run.close_time(_plan(10.0, 4), start=0.0) == 60.0
    assert not run.result.stop_reason
    for node in run.nodes:
        node.job = _job(None)
    # nobody ever: MAX_DEADLINES deadlines, then the run stops as the job would fail
    assert run.close_time(_plan(10.0, 4), start=0.0) == 10.0 + 3 * 50.0
    assert "after 4 deadlines" in run.result.stop_reason


def test_a_buffered_round_closes_on_its_quorum(spec) -> None:
    run = _run(spec, quorum=0.75)
    for node, arrival in zip(run.nodes, (1.0, 2.0, 3.0, 40.0), strict=True):
        node.job = _job(arrival)
    assert run.close_time(_plan(10.0, 3), start=0.0) == 3.0


def test_a_vanished_nodes_unit_never_settles_so_the_round_closes_at_its_deadline(spec) -> None:
    # the marketplace gives the lease back after FAILURE_DETECT_S and the unit waits for
    # someone to redo it: with nobody to, the round closes at its deadline with the others
    run = _run(spec, quorum=1.0)
    for node, arrival in zip(run.nodes, (1.0, 2.0, 3.0, None), strict=True):
        node.job = _job(arrival, sent=1.5)
    assert run.close_time(_plan(10.0, 4), start=0.0) == 10.0
    # a buffered round (quorum 0.75) does not wait for it
    buffered = _run(spec, quorum=0.75)
    for node, arrival in zip(buffered.nodes, (1.0, 2.0, 3.0, None), strict=True):
        node.job = _job(arrival, sent=1.5)
    assert buffered.close_time(_plan(10.0, 3), start=0.0) == 3.0


def test_far_nodes_two_round_jobs_are_not_waited_for_in_their_first_round(spec) -> None:
    run = _run(spec, quorum=1.0)
    for node in run.nodes[:3]:
        node.job = _job(1.0)
    run.nodes[3].job = _job(15.0, two_rounds=True)
    assert run.close_time(_plan(10.0, 3), start=0.0) == 1.0
    run.version = 1  # next round: now it is due
    assert run.is_due(run.nodes[3].job)


@pytest.mark.parametrize(("policy", "folded"), [("stale", True), ("drop", False)])
def test_late_updates_are_folded_in_with_a_weight_or_dropped(spec, policy, folded) -> None:
    run = _run(spec, late_updates=policy)
    for node in run.nodes:
        run.merge(node, 0.0)
    plan, _ = plan_round(run.spec, run.numel, [n.measurement(0.002) for n in run.nodes])
    for node in run.nodes:
        run.send(node, plan.nodes[node.node_id], 1)
    run.version = 1  # the round these updates were for has closed without them
    received = [(n, n.job) for n in run.nodes]
    updates, rejected, stale = run.decode(received)
    assert rejected == 0
    assert (stale, len(updates)) == ((4, 4) if folded else (0, 0))


def test_network_aware_beats_plain_fedavg_on_a_wan(spec) -> None:
    results = compare(spec, 4, "wan", 0, methods=("fedavg", "network_aware"))
    plain, aware = results["fedavg"], results["network_aware"]
    assert aware.reached_target and plain.reached_target
    assert aware.rounds_to_target <= 10
    assert aware.time_to_target_s < plain.time_to_target_s / 2
    assert aware.bytes_up_to_target * 10 < plain.bytes_up_to_target
    assert aware.utilization > plain.utilization


def test_flaky_nodes_are_dropped_and_the_job_still_reaches_its_target(spec) -> None:
    # no overlap: a node that trains on while it waits for a flaky link's model would train
    # thousands of steps a round here (37 s of this test's CPU, and not what it is about)
    spec = spec.replace(adaptation=spec.adaptation.model_dump(mode="json") | {"overlap": False})
    result, _ = NetworkAwareRun(prepare(spec, 6, "flaky", 0)).run()
    assert result.reached_target, result.accuracy_per_round
    assert sum(log.dropped for log in result.log) > 0


def test_variants_set_what_each_method_means() -> None:
    base = load_spec(DIGITS)
    plain = plain_variant(base)
    assert plain.compression.codec == "none" and not plain.adaptation.enabled
    aware = network_aware_variant(base)
    assert aware.adaptation.enabled and aware.compression.codec == "auto"
    assert aware.rounds.late_updates == "stale"
