"""bench.promises_bench's `settlement` and `on_chain` rows from `gpuflex demo --chain`'s
figures: met only where every contribution settled within the goal and is on chain."""

from bench import promises_bench as pb


def _figures(settled: int, on_chain: int, worst: float | None) -> dict:
    return {
        "contributions": 4, "settled": settled, "settlement_p50_s": 12.0,
        "settlement_max_s": worst, "on_chain_records": on_chain,
        "on_chain_per_round": [{"round": 1, "verified": 4, "on_chain": on_chain}],
    }  # fmt: skip


def _rows(chain: dict) -> dict:
    return {r["key"]: r for r in pb.rows({}, {}, chain)}


def test_all_settled_within_the_goal_and_on_chain_is_met() -> None:
    rows = _rows(_figures(4, 4, 29.5))
    assert (rows["settlement"]["measured"], rows["settlement"]["met"]) == (29.5, True)
    assert (rows["on_chain"]["measured"], rows["on_chain"]["met"]) == (1.0, True)
    assert rows["settlement"]["real_processes"] and rows["on_chain"]["real_processes"]


def test_a_slow_or_missing_settlement_is_not_met() -> None:
    assert _rows(_figures(4, 4, 37.1))["settlement"]["met"] is False
    # one contribution never settled: the max of the others settles nothing
    partial = _rows(_figures(3, 3, 20.0))
    assert partial["settlement"]["met"] is None
    assert (partial["on_chain"]["measured"], partial["on_chain"]["met"]) == (0.75, False)


def test_a_demo_that_did_not_run_leaves_both_rows_unmeasured() -> None:
    rows = _rows({"error": "hardhat node did not answer eth_chainId"})
    for key in ("settlement", "on_chain"):
        assert rows[key]["measured"] is None and rows[key]["met"] is None
        assert not rows[key]["real_processes"]
        assert "eth_chainId" in rows[key]["detail"]["error"]
