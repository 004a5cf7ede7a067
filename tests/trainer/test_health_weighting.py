"""Health weighting (spec aggregation.weighting: health): the pure weighting function, the
spec rule that only weight-taking strategies accept it, provenance replay of a weighted round,
and the network-aware simulator weighting by the round plan's health scores."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, get_args

import pytest
import torch

import trainer.sim.adaptive as adaptive
from trainer.aggregation import ClientUpdate, build_strategy, health_weighted
from trainer.aggregation.weighting import node_health
from trainer.artifacts import ArtifactStore
from trainer.provenance import ProvenanceChain, record_round, verify_with_artifacts
from trainer.sim.adaptive import NetworkAwareRun
from trainer.sim.federated import RunOptions
from trainer.sim.setup import prepare
from trainer.spec import SAMPLE_WEIGHTED, AggregationSpec, SpecError, load_spec, parse_spec

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.yaml"
STRATEGIES = get_args(AggregationSpec.model_fields["strategy"].annotation)


def _update(node: str, value: float, samples: int) -> tuple[ClientUpdate, str]:
    delta = {"w": torch.full((2, 3), value), "b": torch.full((3,), -value)}
    return ClientUpdate(node, delta, samples, {"loss": 1.0}), f"shard-{node}"


def _fedavg(updates: list[tuple[ClientUpdate, str]]) -> dict[str, torch.Tensor]:
    """What FedAvg adds to the global model: its sample-weighted mean of the deltas."""
    zero = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    return build_strategy(AggregationSpec()).aggregate(zero, [u for u, _ in updates])


# -- the pure function -------------------------------------------------------------------------


def test_sample_weighting_of_the_result_gives_samples_times_health() -> None:
    updates = [_update("a", 1.0, 10), _update("b", 4.0, 30)]
    weighted, used = health_weighted(updates, {"a": 1.0, "b": 0.5})
    assert used == "health"
    # (10 x 1 x 1 + 30 x 0.5 x 4) / (10 x 1 + 30 x 0.5) = 70 / 25
    assert torch.allclose(_fedavg(weighted)["w"], torch.full((2, 3), 70 / 25))
    assert torch.allclose(_fedavg(weighted)["b"], torch.full((3,), -70 / 25))
    # the plain sample mean, (10 + 120) / 40, is not what health weighting gives
    assert torch.allclose(_fedavg(updates)["w"], torch.full((2, 3), 130 / 40))


def test_weighting_keeps_samples_labels_and_order_and_records_the_health() -> None:
    updates = [_update("a", 1.0, 10), _update("b", 4.0, 30)]
    weighted, _ = health_weighted(updates, {"a": 1.0, "b": 0.5})
    assert [(u.node_id, u.num_samples, label) for u, label in weighted] == [
        ("a", 10, "shard-a"),
        ("b", 30, "shard-b"),
    ]
    assert [u.metrics for u, _ in weighted] == [
        {"loss": 1.0, "health": 1.0},
        {"loss": 1.0, "health": 0.5},
    ]
    assert torch.equal(updates[1][0].delta["w"], torch.full((2, 3), 4.0))  # inputs untouched


def test_a_node_without_a_score_counts_as_healthy() -> None:
    updates = [_update("a", 1.0, 10), _update("b", 4.0, 30)]
    weighted, used = health_weighted(updates, {"someone-else": 0.1})
    assert used == "health"
    assert torch.allclose(_fedavg(weighted)["w"], _fedavg(updates)["w"])
    assert node_health("b", {}) == 1.0


def test_a_zero_score_drops_the_node_and_all_zero_falls_back_to_samples() -> None:
    updates = [_update("a", 1.0, 10), _update("b", 4.0, 30)]
    weighted, used = health_weighted(updates, {"a": 0.0, "b": 0.7})
    assert used == "health" and torch.allclose(_fedavg(weighted)["w"], torch.full((2, 3), 4.0))

    weighted, used = health_weighted(updates, {"a": 0.0, "b": 0.0})
    assert used == "samples" and weighted == updates  # the same updates, nothing divided by 0
    assert torch.allclose(_fedavg(weighted)["w"], torch.full((2, 3), 130 / 40))
    assert health_weighted([], {}) == ([], "samples")


def test_scores_are_clamped_to_the_unit_interval_and_must_be_numbers() -> None:
    assert node_health("a", {"a": 1.7}) == 1.0 and node_health("a", {"a": -0.2}) == 0.0
    with pytest.raises(ValueError, match="node 'a'"):
        health_weighted([_update("a", 1.0, 10)], {"a": math.nan})


@pytest.mark.parametrize("strategy", sorted(SAMPLE_WEIGHTED))
def test_every_weighting_strategy_averages_the_health_weighted_deltas(strategy: str) -> None:
    """FedAdam and DiLoCo put their server optimizer on the same mean FedAvg takes."""
    updates = [_update("a", 1.0, 10), _update("b", 4.0, 30), _update("c", -2.0, 20)]
    weighted, _ = health_weighted(updates, {"a": 0.9, "b": 0.2, "c": 0.6})
    combined = build_strategy(AggregationSpec(strategy=strategy))._combine([u for u, _ in weighted])
    expected = (10 * 0.9 * 1.0 + 30 * 0.2 * 4.0 + 20 * 0.6 * -2.0) / (9 + 6 + 12)
    assert torch.allclose(combined["w"], torch.full((2, 3), expected, dtype=torch.float64))


def test_provenance_replays_a_health_weighted_round(tmp_path: Path) -> None:
    """The weight lives in the recorded deltas, so a verifier re-runs the round exactly."""
    spec = AggregationSpec(weighting="health")
    strategy, store, chain = build_strategy(spec), ArtifactStore(tmp_path), ProvenanceChain("j")
    global_state = {"w": torch.randn(2, 3), "b": torch.randn(3)}
    updates = [_update("a", 1.0, 10), _update("b", 4.0, 30), _update("c", -2.0, 20)]
    weighted, _ = health_weighted(updates, {"a": 0.9, "b": 0.2, "c": 0.6})
    new_state = strategy.aggregate(global_state, [u for u, _ in weighted])
    record_round(
        chain, store, round=1, global_state=global_state, strategy=strategy,
        strategy_state_before={}, updates=weighted, new_state=new_state, metrics={},
    )  # fmt: skip
    assert verify_with_artifacts(chain, store, spec).ok
    assert [c.metrics["health"] for c in chain.records[0].contributions] == [0.9, 0.2, 0.6]


# -- the spec ----------------------------------------------------------------------------------


def _spec(aggregation: dict[str, Any]) -> dict[str, Any]:
    return {"name": "x", "aggregation": aggregation}


def test_weighting_defaults_to_samples_and_weighting_strategies_take_health() -> None:
    assert parse_spec(_spec({})).aggregation.weighting == "samples"
    for strategy in SAMPLE_WEIGHTED:
        spec = parse_spec(_spec({"strategy": strategy, "weighting": "health"}))
        assert spec.aggregation.weighting == "health"


@pytest.mark.parametrize("strategy", sorted(set(STRATEGIES) - SAMPLE_WEIGHTED))
def test_health_weighting_with_a_strategy_that_ignores_weights_names_the_field(
    strategy: str,
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec({"strategy": strategy, "weighting": "health"}))
    problems = dict(info.value.problems)
    assert list(problems) == ["aggregation.weighting"]
    assert strategy in problems["aggregation.weighting"]
    assert parse_spec(_spec({"strategy": strategy, "weighting": "samples"}))


def test_an_unknown_weighting_is_refused() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec({"weighting": "stake"}))
    assert "aggregation.weighting" in dict(info.value.problems)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_spec_knows_which_strategies_weight_their_updates(strategy: str) -> None:
    """SAMPLE_WEIGHTED must match the strategies: a strategy is in it exactly when its
    aggregate changes with the updates' num_samples."""
    zero = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    values = (1.0, 1.5, 2.0, 8.0)

    def aggregate(samples: tuple[int, ...]) -> torch.Tensor:
        spec = AggregationSpec(strategy=strategy, byzantine=0, trim_fraction=0.0)
        pairs = enumerate(zip(values, samples, strict=True))
        updates = [_update(str(i), v, n)[0] for i, (v, n) in pairs]
        return build_strategy(spec).aggregate(zero, updates)["w"]

    weighs = not torch.allclose(aggregate((1, 1, 1, 1)), aggregate((1, 1, 1, 50)))
    assert weighs == (strategy in SAMPLE_WEIGHTED)


# -- the network-aware simulator ---------------------------------------------------------------


def test_the_simulator_weighs_updates_by_the_plans_health(monkeypatch) -> None:
    """One round on four lan nodes, node-0's plan health lowered to 0.1: the new global model
    is the num_samples x health mean of the decoded updates, not the sample mean."""
    base = load_spec(DIGITS)
    spec = base.replace(
        adaptation={"enabled": True, "max_local_steps": 20},
        aggregation={"strategy": "fedavg", "weighting": "health"},
        # whole-model delivery: the new model is the aggregate itself, not its int8 delta
        compression={"download_codec": "none"},
    )
    run = NetworkAwareRun(prepare(spec, 4, "lan", 0), RunOptions(max_rounds=1))
    plans, decoded = [], []

    def plan_round(*args: Any, **kwargs: Any):
        plan, state = real_plan_round(*args, **kwargs)
        low = dataclasses.replace(plan.nodes["node-0"], health=0.1)
        plan = dataclasses.replace(plan, nodes={**plan.nodes, "node-0": low})
        plans.append(plan)
        return plan, state

    def decode(received):
        out = real_decode(received)
        decoded.append(out[0])
        return out

    real_plan_round, real_decode = adaptive.plan_round, run.decode
    monkeypatch.setattr(adaptive, "plan_round", plan_round)
    monkeypatch.setattr(run, "decode", decode)
    start = {k: v.clone() for k, v in run.global_state.items()}
    result, state = run.run()

    updates = decoded[0]
    assert len(updates) == 4 and result.log[0].participants == 4  # none filtered out
    health = {nid: p.health for nid, p in plans[0].nodes.items()}
    assert health["node-0"] == 0.1 and min(h for n, h in health.items() if n != "node-0") > 0.5

    def mean(weight) -> dict[str, torch.Tensor]:
        total = sum(weight(u) for u, _ in updates)
        return {
            k: start[k] + sum(weight(u) * u.delta[k].double() for u, _ in updates).float() / total
            for k in start
        }

    weighted = mean(lambda u: u.num_samples * health[u.node_id])
    plain = mean(lambda u: u.num_samples)
    for k in start:
        torch.testing.assert_close(state[k], weighted[k], rtol=1e-4, atol=1e-6)
    assert max((state[k] - plain[k]).abs().max().item() for k in start) > 1e-3
