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
    rows = pb.rows(FED, _naive(True, 100.0, 1e6))  # nothing carried: others unmeasured
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


# bench.promises_cluster's JSON: node counts as string keys, as json.loads gives them
CLUSTER = {
    "setup": {"step_s": 2.0, "global_batch": 100},
    "scaling": {
        "1": {"online": 1, "time_to_target_s": 100.0, "rounds": 6, "job_wall_s": 100.0,
              "utilization": 0.9},
        "10": {"online": 10, "time_to_target_s": 20.0, "rounds": 6, "job_wall_s": 20.0,
               "utilization": 0.5, "task_compute_nominal_s": 2.0,
               "fixed_costs": {"task_s": 1.0, "round_s": 0.5}},
    },
    "centralized": {"nodes": 10, "time_to_target_s": 15.0, "steps": 70},
    "failures": {"nodes": 10, "time_to_target_s": 30.0, "rounds": 7,
                 "killed": [{"round": 1, "agents": ["gpu-3", "gpu-7"]}]},
    "upload_to_training": {"rows": 60_000, "bytes": 6_000_000, "first_lease_s": 7.5},
    "dashboard": {"changes": 40, "frames_seen": 40, "p50_ms": 20.0, "p99_ms": 80.0},
    "simulated": {"1": {"time_to_target_s": 90.0, "utilization": 0.95},
                  "10": {"time_to_target_s": 10.0, "utilization": 0.8}},
    "simulated_centralized_s": 9.0,
    "simulated_failures": {"time_to_target_s": 11.0},
}  # fmt: skip


def test_the_cluster_rows_are_ratios_against_their_goals() -> None:
    rows = {r["key"]: r for r in pb.rows(None, None, cluster=CLUSTER)}
    assert rows["scaling"]["measured"] == 100.0 / (10 * 20.0)  # efficiency 0.5: missed
    assert rows["scaling"]["met"] is False
    assert rows["scaling"]["simulated"] == 90.0 / (10 * 10.0)
    assert rows["centralized"]["measured"] == 15.0 / 20.0 and rows["centralized"]["met"] is False
    assert rows["centralized"]["simulated"] == 9.0 / 10.0
    assert rows["failures"]["measured"] == 1.5 and rows["failures"]["met"] is False
    assert rows["failures"]["simulated"] == 11.0 / 10.0
    assert rows["utilization"]["measured"] == 0.5 and rows["utilization"]["simulated"] == 0.8
    assert rows["upload_to_training"]["measured"] == 7.5
    assert rows["upload_to_training"]["met"] is False
    assert rows["dashboard"]["measured"] == 80.0 and rows["dashboard"]["met"] is True
    for key in ("scaling", "centralized", "failures", "utilization", "upload_to_training",
                "dashboard"):  # fmt: skip
        assert rows[key]["real_processes"] is True, key
    # naive and bytes were not run: not measured, not invented
    assert rows["naive"]["measured"] is None and rows["bytes"]["measured"] is None
    table = "\n".join(pb.render(list(rows.values())))
    assert "emulate a GPU of a fixed speed by waiting" in table
    assert "GPUFLEX_EMULATED_SAMPLE_S`=0.02" in table  # how the GPU is emulated, in the row
    # a missed row says why (its measured fixed costs against its compute) and what would
    # meet it: efficiency 0.8 with 2 s of compute needs fixed costs of at most 0.5 s a round
    note = rows["scaling"]["detail"]["note"]
    assert "1.5 s of fixed costs" in note and "fixed costs ≤ 0.50 s a round" in note
    assert "10: 1.5 s" in note


def test_a_cluster_run_that_broke_measures_nothing_it_did_not_reach() -> None:
    broken = {"setup": CLUSTER["setup"], "scaling": {"1": CLUSTER["scaling"]["1"]},
              "error": "RuntimeError: the web server exited"}  # fmt: skip
    rows = {r["key"]: r for r in pb.rows(None, None, cluster=broken)}
    for key in ("scaling", "centralized", "failures", "upload_to_training", "dashboard"):
        assert rows[key]["measured"] is None and rows[key]["met"] is None, key
        assert not rows[key]["real_processes"]
        assert rows[key]["detail"]["run_error"] == broken["error"]


def test_rows_not_run_this_time_are_carried_and_say_so() -> None:
    old = {r["key"]: r for r in pb.rows(FED, _naive(True, 100.0, 1e6))}
    rows = {r["key"]: r for r in pb.rows(None, None, cluster=CLUSTER, carried=old)}
    assert rows["naive"]["measured"] == 0.1 and rows["naive"]["carried"] is True
    assert "carried" not in rows["scaling"]  # measured now
    assert "*carried*" in "\n".join(pb.render(list(rows.values())))


def test_the_parts_to_run_are_named_or_refused() -> None:
    assert pb.parts(None) == pb.PARTS
    assert pb.parts("cluster, chain") == ("cluster", "chain")
    try:
        pb.parts("cluster,naive")
    except ValueError as exc:
        assert "naive" in str(exc) and "live" in str(exc)
    else:
        raise AssertionError("an unknown part was accepted")


def test_failures_are_timed_against_the_same_agents_warm_where_that_baseline_ran() -> None:
    """The scaling run at 10 pays its freshly started agents' warm-up; a warm baseline (the
    same agents, none killed) is the failure run's like for like, in the measurement and in
    the simulator's prediction."""
    warm = CLUSTER | {"warm_baseline": {"nodes": 10, "time_to_target_s": 24.0},
                      "simulated_warm_baseline": {"time_to_target_s": 10.0}}  # fmt: skip
    row = {r["key"]: r for r in pb.rows(None, None, cluster=warm)}["failures"]
    assert row["measured"] == 30.0 / 24.0 and row["met"] is True
    assert row["simulated"] == 11.0 / 10.0
    assert "against the same agents warm" in row["detail"]["note"]
