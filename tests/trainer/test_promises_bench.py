"""bench.promises_bench: the promises table from its runs' figures; rows not measured stay
null, bounds settle only what they can, and results.md names where every table's figures
come from."""

import json

from bench import promises_bench as pb
from bench.run import RESULTS, render

FED = {
    "measured": {"time_to_target_s": 10.0, "reached_target": True, "rounds": 6,
                 "mean_bytes_up_per_node": 20_000, "mean_bytes_down_per_node": 30_000},
    "predicted": {"time_to_target_s": 6.0, "bytes_up_per_node": 10_000,
                  "bytes_down_per_node": 20_000},
}  # fmt: skip


def _naive(reached: bool, wall_s: float, nbytes: float) -> dict:
    measured = {
        "reached_target": reached,
        "job_wall_s": wall_s,
        "rounds": 100,
        "time_to_target_s": wall_s if reached else None,
        "mean_bytes_up_per_node": nbytes / 2,
        "mean_bytes_down_per_node": nbytes / 2,
    }
    return {"measured": measured, "predicted": {"time_to_target_s": 300.0,
            "bytes_up_per_node": 6e6, "bytes_down_per_node": 6e6}}  # fmt: skip


def test_every_key_the_issue_names_has_one_row() -> None:
    rows = pb.rows(FED, _naive(True, 100.0, 1e6))
    assert [r["key"] for r in rows] == [
        "naive", "scaling", "centralized", "failures", "settlement", "on_chain", "dashboard",
        "upload_to_training", "utilization", "bytes",
    ]  # fmt: skip
    for row in rows:
        assert {"key", "promise", "goal", "measured", "simulated", "met", "real_processes"} <= set(
            row
        )
    unmeasured = [r for r in rows if r["key"] not in ("naive", "bytes")]
    assert all(r["measured"] is None and r["met"] is None for r in unmeasured)
    assert not any(r["real_processes"] for r in unmeasured)


def test_finished_runs_give_exact_figures() -> None:
    rows = {r["key"]: r for r in pb.rows(FED, _naive(True, 100.0, 1e6))}
    assert rows["naive"]["measured"] == 0.1 and rows["naive"]["met"] is True
    assert rows["naive"]["simulated"] == 6.0 / 300.0
    assert rows["bytes"]["measured"] == 1e6 / 50_000 and rows["bytes"]["met"] is False
    assert rows["naive"]["real_processes"] and rows["bytes"]["real_processes"]


def test_a_naive_run_stopped_short_gives_bounds_that_settle_only_what_they_can() -> None:
    rows = {r["key"]: r for r in pb.rows(FED, _naive(False, 12.0, 1e6))}
    # naive took more than 12 s: the ratio is below 10/12, which does not settle <= 0.7
    assert rows["naive"]["bound"] == "upper" and rows["naive"]["met"] is None
    # naive sent more than 1 MB: the ratio is above 20, which does not settle >= 400
    assert rows["bytes"]["bound"] == "lower" and rows["bytes"]["met"] is None
    rows = {r["key"]: r for r in pb.rows(FED, _naive(False, 600.0, 1e9))}
    assert rows["naive"]["met"] is True and rows["bytes"]["met"] is True


def test_a_broken_run_is_not_measured() -> None:
    broken = {"measured": {"error": "timed out"}, "predicted": None}
    rows = {r["key"]: r for r in pb.rows(broken, broken)}
    assert rows["naive"]["measured"] is None and rows["naive"]["met"] is None
    assert not rows["naive"]["real_processes"]
    assert "not measured" in "\n".join(pb.render(list(rows.values())))


def test_results_md_says_where_each_tables_figures_come_from() -> None:
    lines = render(json.loads((RESULTS / "results.json").read_text())).splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert heads
    for i in heads:
        assert lines[i + 2].startswith("Figures from: "), lines[i]
    text = "\n".join(lines)
    assert "lease_batch` (in-process; the server never calls it" in text
