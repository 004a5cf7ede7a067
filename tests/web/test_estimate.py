"""The cost and time estimate, the latency heatmap and the spec problems' lines: pure code."""

from __future__ import annotations

from decimal import Decimal

from marketplace.web.estimate import Offer, Work, estimate, samples_per_s, train_samples, work_of
from marketplace.web.heatmap import latency_matrix, level
from marketplace.web.views.common import problem_lines
from tests.marketplace.helpers import SMALL_SPEC
from trainer.spec import parse_spec


def test_work_of_a_steps_spec_counts_tasks_and_steps() -> None:
    spec = parse_spec(SMALL_SPEC)
    work = work_of(spec, train_samples(spec), default_shards=4)
    assert work == Work(rounds=2, tasks_per_round=3, steps_per_task=8, batch_size=32)


def test_work_of_an_epochs_spec_uses_the_dataset_size() -> None:
    spec = parse_spec(SMALL_SPEC | {"local": {"epochs": 1, "batch_size": 32}})
    work = work_of(spec, 1437, default_shards=4)
    assert work.steps_per_task == 15  # ceil(1437 / 3 / 32)


def test_estimate_takes_the_cheapest_nodes_under_the_cap() -> None:
    work = Work(rounds=10, tasks_per_round=2, steps_per_task=100, batch_size=36)
    offers = [
        Offer(Decimal("2.00"), 1000.0),  # over the cap
        Offer(Decimal("0.50"), 3600.0),
        Offer(Decimal("0.30"), 3600.0),
        Offer(Decimal("0.90"), 3600.0),
    ]
    est = estimate(work, offers, max_price=Decimal("1.00"), tier="platform")
    assert est is not None
    assert est.nodes == 2 and (est.price_low, est.price_high) == (Decimal("0.30"), Decimal("0.50"))
    # 10 rounds x 2 tasks x 3600 samples at 3600 samples/s = 20 GPU-seconds
    assert abs(est.gpu_hours - 20 / 3600) < 1e-9
    assert est.cost == Decimal("0.0022")  # 20 s at the mean price 0.40 per hour
    assert est.seconds == 10 * (1 + 2.0)  # one wave of 1 s per round plus the overhead


def test_estimate_is_none_when_nothing_is_affordable() -> None:
    work = Work(rounds=1, tasks_per_round=1, steps_per_task=1, batch_size=1)
    assert estimate(work, [Offer(Decimal("3"), None)], max_price=Decimal("1")) is None


def test_replication_makes_volunteer_jobs_cost_more() -> None:
    work = Work(rounds=5, tasks_per_round=4, steps_per_task=50, batch_size=32)
    offers = [Offer(Decimal("0.40"), 5000.0)] * 4
    platform = estimate(work, offers, max_price=Decimal("1"), tier="platform")
    volunteer = estimate(work, offers, max_price=Decimal("1"), tier="volunteer")
    assert platform and volunteer and volunteer.gpu_hours > platform.gpu_hours


def test_samples_per_s_reads_the_benchmark() -> None:
    assert samples_per_s({"train_samples_per_s": {"mlp": 100.0}}, "cnn") == 100.0
    assert samples_per_s({"train_samples_per_s": 50}, "mlp") == 50.0
    assert samples_per_s({}, "mlp") is None


def test_latency_matrix_sums_rtts_through_the_server() -> None:
    m = latency_matrix([20.0, 100.0, None])
    assert m[0][0].ms == 20.0 and m[0][1].ms == 120.0 and m[1][0].ms == 120.0
    assert m[2][0].ms is None and m[2][0].level == -1
    assert level(0) == 0 and level(10_000) == 9


def test_problem_lines_find_nested_keys() -> None:
    text = "name: x\nrounds:\n  max_rounds: 2\nlocal:\n  steps: 0\n  batch_size: 32\n"
    found = problem_lines(text, [{"field": "local.steps", "reason": "too small"},
                                 {"field": "model", "reason": "missing"}])  # fmt: skip
    assert found[0]["line"] == 5 and found[1]["line"] is None


def test_comparison_data_from_the_bench_results(tmp_path) -> None:
    from marketplace.web.compare import chart_data, load_results

    assert load_results(tmp_path / "missing.json") is None
    results = load_results()
    if results is None:  # an installed package carries no bench/ folder
        return
    data = chart_data(results)
    first = data["scenarios"][0]
    assert [m["key"] for m in first["methods"]] == ["naive_sync", "fedavg", "network_aware"]
    assert all(len(m["times"]) == len(m["accuracy"]) for m in first["methods"])
    assert first["speedup"] > 1


def test_cost_is_priced_as_the_ledger_charges() -> None:
    """seconds on the node x its speed factor x its price, plus the largest bonus."""
    work = Work(rounds=1, tasks_per_round=1, steps_per_task=100, batch_size=36)  # 3600 samples
    plain = estimate(work, [Offer(Decimal("1.80"), 1.0)], max_price=Decimal("2"), tier="platform")
    assert plain is not None and plain.cost == Decimal("1.8000")  # one hour at 1.80
    fast = estimate(
        work, [Offer(Decimal("1.80"), 4.0, speed=4.0)], max_price=Decimal("2"), tier="platform"
    )
    assert fast is not None and fast.cost == plain.cost  # a 4x GPU: a quarter of the time
    assert fast.seconds < plain.seconds
    bonus = estimate(work, [Offer(Decimal("1.80"), 1.0)], max_price=Decimal("2"),
                     tier="platform", bonus_max=Decimal("0.10"))  # fmt: skip
    assert bonus is not None and bonus.cost == Decimal("1.9800")
