"""bench.exported_bench.compare: what the real-agents figure of #33 says of two runs."""

from __future__ import annotations

from typing import Any

from bench.exported_bench import compare


def _run(accuracy: list[float], took: list[list[tuple[int, str, float]]]) -> dict[str, Any]:
    return {
        "accuracy_per_round": accuracy,
        "aggregated": [[{"shard": s, "node": n, "steps": 15, "loss": loss} for s, n, loss in r]
                       for r in took],
    }  # fmt: skip


def test_same_updates_on_other_nodes_are_within() -> None:
    zoo = _run([0.7, 0.8], [[(0, "a", 2.1), (1, "b", 2.2)], [(0, "a", 1.8), (1, "b", 1.9)]])
    exp = _run([0.7, 0.8], [[(0, "b", 2.1), (1, "a", 2.2)], [(0, "a", 1.8), (1, "b", 1.9)]])
    out = compare(zoo, exp)
    assert out["within_0_01"] and out["max_abs_diff"] == 0.0
    assert out["same_shards_aggregated"] and out["same_update_losses"]
    assert (out["updates_on_other_node"], out["updates"]) == (2, 4)


def test_a_round_that_aggregated_other_shards_is_named() -> None:
    zoo = _run([0.7, 0.8], [[(0, "a", 2.1), (1, "b", 2.2)], [(0, "a", 1.8), (1, "b", 1.9)]])
    # round 2 closed on one update: fewer shards, another loss, accuracy off by 0.02
    exp = _run([0.7, 0.78], [[(0, "a", 2.1), (1, "b", 2.2)], [(1, "b", 1.9)]])
    out = compare(zoo, exp)
    assert not out["within_0_01"] and abs(out["max_abs_diff"] - 0.02) < 1e-9
    assert not out["same_shards_aggregated"] and not out["same_update_losses"]


def test_fewer_rounds_is_not_within_even_where_they_agree() -> None:
    zoo = _run([0.7, 0.8], [[(0, "a", 2.1)], [(0, "a", 1.8)]])
    exp = _run([0.7], [[(0, "a", 2.1)]])
    out = compare(zoo, exp)
    assert out["max_abs_diff"] == 0.0 and not out["same_rounds"] and not out["within_0_01"]
