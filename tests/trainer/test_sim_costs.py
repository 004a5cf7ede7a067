"""The simulator's fixed per-task and per-round costs: exact arithmetic in every mode, zero is
the old pure model, the CLI flags reach it, and the defaults match the measured rounds."""

import json
import statistics
from pathlib import Path

import pytest

from trainer.sim.adaptive import run_network_aware
from trainer.sim.cli import _costs, _parser, main
from trainer.sim.compare import network_aware_variant
from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.naive import run_naive_sync
from trainer.sim.network import (
    COLD_TASKS,
    FIXED_COSTS,
    NO_FIXED_COSTS,
    WARM_TASKS,
    FixedCosts,
)
from trainer.sim.setup import prepare
from trainer.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits-mlp.yaml"
COSTS = FixedCosts(task_s=0.7, round_s=0.3)
ALL_ROUNDS = RunOptions(max_rounds=3, stop_at_target=False)


@pytest.fixture(scope="module")
def spec():
    return load_spec(DIGITS)


def _aware(spec, **adaptation):
    aware = network_aware_variant(spec)
    return aware.replace(adaptation={"enabled": True, "max_local_steps": 150, **adaptation})


def test_fedavg_rounds_pay_one_task_per_node_in_parallel_and_one_round_cost(spec) -> None:
    # flaky: nodes that drop out pay the task cost too, before they vanish
    pure, _ = run_federated(prepare(spec, 4, "flaky", 0, costs=NO_FIXED_COSTS), ALL_ROUNDS)
    paid, _ = run_federated(prepare(spec, 4, "flaky", 0, costs=COSTS), ALL_ROUNDS)
    assert sum(log.dropped for log in paid.log) > 0
    for a, b in zip(pure.log, paid.log, strict=True):
        # every node's finish moves by task_s, so the slowest does; then the round's cost
        assert b.round_s == pytest.approx(a.round_s + 0.7 + 0.3)
        # every node waits through the server's round cost
        assert b.idle_s == pytest.approx(a.idle_s + 4 * 0.3)
    assert paid.sim_wall_s == pytest.approx(pure.sim_wall_s + 3 * (0.7 + 0.3))
    assert paid.model_hash == pure.model_hash  # time never changes what FedAvg trains


def test_naive_sync_pays_the_task_cost_once_and_no_round_cost(spec) -> None:
    pure, _ = run_naive_sync(
        prepare(spec, 4, "wan", 0, costs=NO_FIXED_COSTS), max_rounds=3, stop_at_target=False
    )
    paid, _ = run_naive_sync(
        prepare(spec, 4, "wan", 0, costs=COSTS), max_rounds=3, stop_at_target=False
    )
    shifts = [b.sim_time_s - a.sim_time_s for a, b in zip(pure.log, paid.log, strict=True)]
    assert shifts == pytest.approx([0.7, 0.7, 0.7])


def test_network_aware_rounds_pay_the_task_cost_and_the_round_cost(spec) -> None:
    # without overlap and with a full quorum every task waits on its model, so each round
    # grows by exactly one task cost and one round cost
    aware = _aware(spec, overlap=False)
    aware = aware.replace(rounds={**aware.rounds.model_dump(mode="json"), "quorum": 1.0})
    pure, _ = run_network_aware(prepare(aware, 4, "lan", 0, costs=NO_FIXED_COSTS), ALL_ROUNDS)
    paid, _ = run_network_aware(prepare(aware, 4, "lan", 0, costs=COSTS), ALL_ROUNDS)
    for a, b in zip(pure.log, paid.log, strict=True):
        assert b.round_s == pytest.approx(a.round_s + 0.7 + 0.3)
    assert paid.sim_wall_s == pytest.approx(pure.sim_wall_s + 3 * (0.7 + 0.3))


def test_network_aware_with_overlap_pays_both_in_its_first_round(spec) -> None:
    # later rounds overlap the task cost with training, as they do the download
    aware = _aware(spec)
    assert aware.adaptation.overlap
    pure, _ = run_network_aware(prepare(aware, 4, "wan", 0, costs=NO_FIXED_COSTS), ALL_ROUNDS)
    paid, _ = run_network_aware(prepare(aware, 4, "wan", 0, costs=COSTS), ALL_ROUNDS)
    assert paid.log[0].sim_time_s == pytest.approx(pure.log[0].sim_time_s + 0.7 + 0.3)
    assert paid.sim_wall_s > pure.sim_wall_s


def test_zero_costs_reproduce_the_pure_model(spec) -> None:
    # figures from the simulator before fixed costs were modelled (same specs and seeds)
    fed, _ = run_federated(prepare(spec, 4, "flaky", 0, costs=NO_FIXED_COSTS), ALL_ROUNDS)
    # (since re-measured: a vanished node is noticed as the marketplace notices it, after
    # FAILURE_DETECT_S = 50 s rather than 5 s: the three rounds with a drop-out each take 45 s
    # longer, 17.79 s + 3 x 45 s, and the other nodes idle through it)
    assert fed.sim_wall_s == pytest.approx(17.78869092748635 + 3 * 45.0, rel=1e-12)
    assert fed.idle_s == pytest.approx(396.0037505731814, rel=1e-12)
    naive, _ = run_naive_sync(
        prepare(spec, 4, "wan", 0, costs=NO_FIXED_COSTS), max_rounds=2, stop_at_target=False
    )
    assert naive.sim_wall_s == pytest.approx(51.60746161325383, rel=1e-12)
    aware, _ = run_network_aware(
        prepare(_aware(spec), 4, "wan", 0, costs=NO_FIXED_COSTS), ALL_ROUNDS
    )
    # (since re-measured: later models reach nodes as the job's int8 delta chain, sized as the
    # marketplace sends it, rather than as per-node deltas; and round 1's download is the spec
    # itself, a few bytes longer with each spec field added: download_codec, weighting,
    # elastic, tracking, and the models a buyer brings and the isolation a job requires)
    # (and since: zones, privacy, secure aggregation, sweeps)
    # (and since: rounds close by the marketplace's rules, trainer.round_lifecycle: at the
    # plan's deadline with what came, and `rounds.mode` in the spec)
    expected = [0.6784039809477934, 1.1727871304001642, 1.8511911113479576]
    assert aware.sim_time_per_round == pytest.approx(expected, rel=1e-12)


def test_fixed_costs_refuse_negative_and_non_finite_seconds() -> None:
    FixedCosts(task_s=0.0, round_s=0.0)
    for bad in ({"task_s": -0.1, "round_s": 0.0}, {"task_s": 0.0, "round_s": float("nan")}):
        with pytest.raises(ValueError, match="must be finite and >= 0"):
            FixedCosts(**bad)


def test_defaults_are_the_warm_bench_figures_and_presets_are_named(spec) -> None:
    assert prepare(spec, 2, "lan", 0).costs is WARM_TASKS
    assert FIXED_COSTS == {"warm": WARM_TASKS, "cold": COLD_TASKS, "none": NO_FIXED_COSTS}
    assert WARM_TASKS.task_s < 1 < COLD_TASKS.task_s


def _sim_wall(capsys, *flags: str) -> float:
    argv = ["run", str(DIGITS), "--nodes", "2", "--network", "lan", "--rounds", "2", "--json"]
    assert main([*argv, *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sim_wall_s"]


def test_cli_flags_reach_the_model(capsys) -> None:
    pure = _sim_wall(capsys, "--fixed-costs", "none")
    assert _sim_wall(capsys, "--task-fixed-s", "0", "--round-fixed-s", "0") == pytest.approx(pure)
    flags = ("--task-fixed-s", "1.5", "--round-fixed-s", "0.25")
    assert _sim_wall(capsys, *flags) == pytest.approx(pure + 2 * 1.75)
    # a preset, one of its values overridden
    cold = _sim_wall(capsys, "--fixed-costs", "cold", "--round-fixed-s", "0")
    assert cold == pytest.approx(pure + 2 * COLD_TASKS.task_s)
    assert _sim_wall(capsys) == pytest.approx(pure + 2 * (WARM_TASKS.task_s + WARM_TASKS.round_s))


def test_cli_compare_takes_the_same_flags() -> None:
    args = _parser().parse_args(["compare", "x.yaml", "--task-fixed-s", "2"])
    assert _costs(args) == FixedCosts(task_s=2.0, round_s=WARM_TASKS.round_s)


@pytest.mark.parametrize("command", ["run", "compare"])
@pytest.mark.parametrize("flag", ["--task-fixed-s", "--round-fixed-s"])
def test_cli_refuses_negative_costs_naming_the_flag(command, flag, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, str(DIGITS), flag, "-0.5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a finite number of seconds >= 0, got -0.5" in err


def test_the_defaults_put_a_simulated_round_within_2x_of_the_measured_one() -> None:
    """The round-phase bench's job and nodes (plain FedAvg, five lan agents) in the simulator:
    its median round against the median the bench measured, warm and cold."""
    from bench.rounds_bench import SPEC_FLOWER

    measured = json.loads((ROOT / "bench" / "results" / "results.json").read_text())["rounds"]
    spec = parse_spec(SPEC_FLOWER)
    options = RunOptions(max_rounds=spec.rounds.max_rounds, stop_at_target=False)
    for mode, costs in (("warm", WARM_TASKS), ("cold", COLD_TASKS)):
        result, _ = run_federated(prepare(spec, 5, "lan", spec.seed, costs=costs), options)
        simulated = statistics.median(log.round_s for log in result.log)
        real = measured[mode]["median_round_s"]
        assert real / 2 <= simulated <= 2 * real, (mode, simulated, real)
