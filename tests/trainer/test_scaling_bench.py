"""The scaling bench's arithmetic and its centralized baseline (bench/scaling_bench.py)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from bench import scaling_bench as sb
from trainer.sim.network import get_profile


def test_speedups_and_efficiency_against_the_fewest_nodes():
    rows = sb.speedups({10: 20.0, 1: 100.0, 2: 50.0, 50: None})
    assert list(rows) == [1, 2, 10, 50]
    assert rows[1] == {"speedup": 1.0, "efficiency": 1.0}
    assert rows[2] == {"speedup": 2.0, "efficiency": 1.0}
    assert rows[10] == {"speedup": 5.0, "efficiency": 0.5}
    assert rows[50] == {"speedup": None, "efficiency": None}  # never reached the target
    rows = sb.speedups({2: 50.0, 4: 30.0})
    assert rows[4]["speedup"] == pytest.approx(5 / 3)
    assert rows[4]["efficiency"] == pytest.approx(5 / 6)  # 4 nodes are 2x the 2 of the base


def test_central_fraction():
    assert sb.central_fraction(8.0, 10.0) == pytest.approx(0.8)
    assert sb.central_fraction(8.0, None) is None
    assert sb.central_fraction(None, 10.0) is None


def test_node_batch_splits_the_global_batch():
    assert [sb.node_batch(n, 100) for n in (1, 2, 3, 50, 200)] == [100, 50, 33, 2, 1]
    with pytest.raises(ValueError):
        sb.node_batch(0)


def test_compute_scale_gives_the_global_step_time():
    nominal = get_profile("lan").node(0, 1, 0)
    flops, batch = 3e6, 100
    scale = sb.compute_scale(flops, batch, 10.0)
    assert nominal.step_s(flops * scale * batch) == pytest.approx(10.0)
    # one of N nodes on 1/N of the batch: 1/N of the FLOPs time, plus the fixed overhead
    assert nominal.step_s(flops * scale * batch / 10) == pytest.approx(1.0 + 0.9 * 2e-3)
    with pytest.raises(ValueError):
        sb.compute_scale(flops, batch, 1e-3)


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory):
    source = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    corpus = tmp_path_factory.mktemp("text") / "corpus.txt"
    corpus.write_bytes(source.read_bytes()[:6000])
    return sb.job_spec(
        corpus,
        8,
        model={"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2},
        rounds={"max_rounds": 3, "target": {"metric": "loss", "value": 0.01}},  # unreachable
    )


def test_a_node_n_times_as_fast_trains_the_same_in_1_nth_of_the_time(tiny_spec):
    one = sb.centralized_run(tiny_spec, 1.0, global_batch=8, step_s=1.0)
    four = sb.centralized_run(tiny_spec, 4.0, global_batch=8, step_s=1.0)
    assert [log.loss for log in four.log] == [log.loss for log in one.log]
    # every round is EVAL_EVERY steps of the whole global batch at 1 s each, no other costs
    steps = sb.EVAL_EVERY
    assert [log.sim_time_s for log in one.log] == pytest.approx([steps, 2 * steps, 3 * steps])
    assert [log.sim_time_s for log in four.log] == pytest.approx(
        [t / 4 for t in one.sim_time_per_round]
    )


def test_render_and_chart(tmp_path):
    curve = {"sim_time_s": [1.0, 2.0], "loss": [3.0, 2.5]}
    row = {"rounds_to_target": 2, "mean_round_s": 1.0, "utilization": 0.99, "curve": curve}
    data = {
        "setup": {
            "model": {"d_model": 64, "n_layers": 2},
            "parameters": 1000,
            "seq_len": 64,
            "corpus": "a corpus",
            "train_sequences": 90,
            "test_sequences": 10,
            "target_loss": 2.6,
            "global_batch": 100,
            "optimizer": {"name": "sgd", "lr": 0.3},
            "compute_scale": 2.0e4,
            "global_step_s": 10.0,
            "network": "wan",
            "fixed_costs": {"task_s": 0.52, "round_s": 0.16},
            "eval_every_central": 2,
        },
        "network_aware": [
            {
                **row,
                "nodes": 1,
                "node_batch": 100,
                "time_to_target_s": 100.0,
                "speedup": 1.0,
                "efficiency": 1.0,
            },
            {
                **row,
                "nodes": 10,
                "node_batch": 10,
                "time_to_target_s": 12.5,
                "speedup": 8.0,
                "efficiency": 0.8,
            },
            {
                **row,
                "nodes": 50,
                "node_batch": 2,
                "time_to_target_s": None,
                "speedup": None,
                "efficiency": None,
            },
        ],
        "centralized": [
            {"nodes": 10, "time_to_target_s": 9.0, "network_aware_s": 12.5, "fraction": 0.72},
        ],
        "bench_s": 1.0,
    }
    text = "\n".join(sb.render(data))
    assert "| 10 | 10 | 12.5 | 8.00× | 0.80 | 2 | 1.0 | 0.990 |" in text
    assert "| 50 | 2 | — | — | — |" in text
    assert "| 10 | 9.0 | 12.5 | **0.72** | ≥ 0.80 |" in text
    sb.chart(data, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 0
