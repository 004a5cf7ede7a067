"""The simulator end to end: real training on digits over simulated networks."""

import json
from pathlib import Path

import pytest

from trainer.artifacts import ArtifactStore
from trainer.provenance import verify_with_artifacts
from trainer.sim.cli import main
from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.naive import run_naive_sync
from trainer.sim.setup import prepare
from trainer.spec import load_spec

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.yaml"


@pytest.fixture(scope="module")
def spec():
    return load_spec(DIGITS)


def test_cli_eight_wan_nodes_reach_the_target(capsys) -> None:
    assert main(["run", str(DIGITS), "--nodes", "8", "--network", "wan", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["final_accuracy"] >= 0.95
    assert out["final_correct"] * 20 >= 19 * out["test_total"]
    for key in ("rounds", "sim_wall_s", "compute_s", "bytes_up", "bytes_down"):
        assert out[key] > 0, key
    assert len(out["accuracy_per_round"]) == out["rounds"]


def test_cli_reports_bad_input_clearly(tmp_path: Path, capsys) -> None:
    assert main(["run", str(DIGITS), "--network", "moon"]) == 2
    assert "unknown network profile 'moon'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {arch: rnn}\n")
    assert main(["run", str(bad)]) == 2
    assert "model.arch" in capsys.readouterr().err


def test_resumed_run_ends_with_the_same_model_as_an_uninterrupted_one(spec, tmp_path) -> None:
    spec = spec.replace(aggregation={"strategy": "fedadam", "server_lr": 0.01})
    whole, _ = run_federated(prepare(spec, 4, "wan", 0), RunOptions(max_rounds=5))
    ckpt = tmp_path / "ckpt.safetensors"
    first, _ = run_federated(
        prepare(spec, 4, "wan", 0), RunOptions(max_rounds=5, checkpoint=ckpt, stop_after_round=2)
    )
    assert first.rounds == 2
    resumed, _ = run_federated(
        prepare(spec, 4, "wan", 0), RunOptions(max_rounds=5, checkpoint=ckpt, resume=True)
    )
    assert resumed.rounds == whole.rounds == 5
    assert resumed.model_hash == whole.model_hash
    assert resumed.provenance_head == whole.provenance_head
    assert resumed.sim_wall_s == pytest.approx(whole.sim_wall_s)
    assert resumed.accuracy_per_round == whole.accuracy_per_round


@pytest.mark.parametrize("strategy", ["trimmed_mean", "median", "krum"])
def test_robust_aggregators_survive_two_sign_flipping_nodes(spec, strategy) -> None:
    # No norm bound and no statistical filter: this measures the aggregators alone.
    attack = RunOptions(max_rounds=100, adversarial=(0, 1), attack_scale=10.0, min_cosine=None)
    robust = spec.replace(
        aggregation={"strategy": strategy, "trim_fraction": 0.25, "max_update_norm": 1e12}
    )
    result, _ = run_federated(prepare(robust, 8, "lan", 0), attack)
    assert result.reached_target, result.accuracy_per_round


def test_plain_fedavg_fails_under_the_same_attack(spec) -> None:
    attack = RunOptions(max_rounds=100, adversarial=(0, 1), attack_scale=10.0, min_cosine=None)
    spec = spec.replace(aggregation={"strategy": "fedavg", "max_update_norm": 1e12})
    result, _ = run_federated(prepare(spec, 8, "lan", 0), attack)
    assert not result.reached_target
    assert max(result.accuracy_per_round) < 0.5


def test_every_round_close_filters_so_fedavg_survives_it_too(spec) -> None:
    """The statistical filter the marketplace runs, in the simulator's rounds as well
    (trainer.rounds.close_round): the sign-flipped updates never reach the mean."""
    attack = RunOptions(max_rounds=20, adversarial=(0, 1), attack_scale=10.0)
    spec = spec.replace(aggregation={"strategy": "fedavg", "max_update_norm": 1e12})
    result, _ = run_federated(prepare(spec, 8, "lan", 0), attack)
    assert all(log.rejected == 2 and log.participants == 6 for log in result.log)
    assert result.final_accuracy > 0.85  # unfiltered, the same attack keeps it under 0.5


def test_naive_sync_trains_and_pays_for_every_step(spec) -> None:
    setup = prepare(spec, 4, "wan", 0)
    naive, _ = run_naive_sync(setup)
    fed, _ = run_federated(prepare(spec, 4, "wan", 0))
    assert naive.reached_target and fed.reached_target
    # the baseline exchanges gradients every step, FedAvg once a round
    assert naive.time_to_target_s > fed.time_to_target_s
    assert naive.bytes_up_to_target > fed.bytes_up_to_target


def test_flaky_nodes_drop_out_and_the_run_still_finishes(spec) -> None:
    result, _ = run_federated(prepare(spec, 8, "flaky", 0), RunOptions(max_rounds=10))
    dropped = sum(log.dropped for log in result.log)
    assert dropped > 0
    assert all(log.participants + log.dropped == 8 for log in result.log)


def test_provenance_recorded_by_the_simulator_verifies(spec, tmp_path) -> None:
    spec = spec.replace(aggregation={"strategy": "diloco", "server_lr": 0.7})
    store_dir = tmp_path / "prov"
    ckpt = tmp_path / "c.safetensors"
    run_federated(
        prepare(spec, 3, "lan", 0),
        RunOptions(max_rounds=3, provenance_dir=store_dir, checkpoint=ckpt),
    )
    from trainer.checkpoint import load_checkpoint
    from trainer.provenance import ProvenanceChain

    chain = ProvenanceChain.from_json(load_checkpoint(ckpt).extra["provenance"])
    report = verify_with_artifacts(chain, ArtifactStore(store_dir), spec.aggregation)
    assert report.ok, report.problems
    assert report.rounds_replayed == 3


def test_updates_over_the_norm_bound_are_rejected_and_the_round_goes_on(spec) -> None:
    spec = spec.replace(aggregation={"strategy": "fedavg", "max_update_norm": 50.0})
    attack = RunOptions(max_rounds=3, adversarial=(2,), attack_scale=1e4)
    result, _ = run_federated(prepare(spec, 4, "lan", 0), attack)
    assert [log.rejected for log in result.log] == [1, 1, 1]
    assert all(log.participants == 3 for log in result.log)
    assert result.final_accuracy > 0.5


def test_cli_compare_prints_each_method_with_its_figures(tmp_path: Path, capsys) -> None:
    spec = load_spec(DIGITS).replace(adaptation={"max_local_steps": 100})
    path = tmp_path / "small.json"
    path.write_text(json.dumps(spec.to_dict()))
    argv = ["compare", str(path), "--nodes", "4", "--network", "lan", "--target", "0.9", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for method in ("naive_sync", "fedavg", "network_aware"):
        row = out[method]
        for key in (
            "time_to_target_s",
            "bytes_up_per_node_to_target",
            "final_accuracy",
            "utilization",
            "idle_fraction",
        ):
            assert key in row, (method, key)
        assert row["reached_target"], method
    assert out["ratios"]["time_aware_over_fedavg"] is not None


def test_a_simulated_round_closes_on_its_quorum_not_on_a_failed_nodes_detection() -> None:
    """As the marketplace does (trainer.round_lifecycle): 4 of 5 updates in closes a round at
    quorum 0.8; the fifth, later, is dropped as late; a failed node's detection is not
    waited for. At quorum 1.0 the round waits for everything."""
    from trainer.sim.federated import _close_on_quorum

    updates, arrivals = ["a", "b", "c", "d"], [1.0, 4.0, 2.0, 3.0]
    finish = [*arrivals, 55.0]  # the fifth node failed: detected at 55 s
    kept, ends = _close_on_quorum(0.8, 5, updates, arrivals, finish)
    assert kept == updates and max(ends) == 4.0
    kept, ends = _close_on_quorum(0.6, 5, updates, arrivals, finish)  # 3 of 5
    assert kept == ["a", "c", "d"] and max(ends) == 3.0
    kept, ends = _close_on_quorum(1.0, 5, updates, arrivals, finish)
    assert kept == updates and max(ends) == 55.0
    # too few updates for the quorum: the round waits, as before
    kept, ends = _close_on_quorum(0.8, 5, updates[:3], arrivals[:3], [*arrivals[:3], 55.0])
    assert max(ends) == 55.0
