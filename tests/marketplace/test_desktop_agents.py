"""The real contributor agent (desktop/) against the real marketplace over HTTP.

Two headless agents, each running tasks in its own sandboxed process, train a digits job to
completion through the public REST API only; one job sends top-k updates with error
feedback, the agents keeping each job's residual between tasks.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import pytest

from marketplace.jobs.models import Job
from marketplace.rounds.models import Task
from tests.live_agents import live_agent
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Guards against hanging only; nothing here asserts how fast."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _run_to_completion(job_id, url, provider_key, tmp_path, monkeypatch, kind) -> list:
    """Two real agents of `kind` work until the job completes; returns them, stopped."""
    agents = [
        live_agent(tmp_path, f"agent-{i}", url, provider_key, monkeypatch, kind=kind)
        for i in range(2)
    ]
    for agent in agents:
        agent.start()
    try:
        _wait(lambda: Job.objects.get(pk=job_id).status == "completed", 240, "the job")
    finally:
        for agent in agents:
            agent.stop()
    return agents


# Volunteers on a hybrid job: every task of a new node is replicated and verified.
# Platform nodes on a platform job: no replicas, so top-k with error feedback is used as is.
@pytest.mark.parametrize(
    ("codec", "kind", "tier", "used"),
    [
        ("none", "volunteer", "hybrid", {"none"}),
        ("topk", "volunteer", "hybrid", {"int8", "topk"}),
        ("topk", "platform", "platform", {"topk"}),
    ],
)
def test_agents_train_a_job_to_completion(
    live_server, make_user, submit, tmp_path, monkeypatch, codec, kind, tier, used
) -> None:
    _, provider_key = make_user("provider")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["compression"] = {"codec": codec, "topk_fraction": 0.2}
    job = submit(spec=spec, tier=tier)
    agents = _run_to_completion(job["id"], live_server.url, provider_key, tmp_path, monkeypatch,
                                kind)  # fmt: skip
    stored = Job.objects.get(pk=job["id"])
    assert stored.rounds_done == 2 and stored.model_hash
    tasks = Task.objects.filter(round__job=stored)
    assert tasks.filter(status="done").count() >= 6
    rows = list(tasks.values_list("round_id", "shard_id", "codec"))
    assert {c for _, _, c in rows} <= used
    # A replicated unit must verify, so top-k (node-dependent through its residual) travels
    # as int8 there; new volunteers are always replicated, trusted ones only sometimes.
    units: dict[tuple[int, int], list[str]] = {}
    for round_id, shard_id, task_codec in rows:
        units.setdefault((round_id, shard_id), []).append(task_codec)
    for unit, codecs in units.items():
        if len(codecs) > 1 and codec != "none":
            assert set(codecs) == {"int8"}, unit
    assert any(len(c) > 1 for c in units.values()) == (kind == "volunteer")
    assert sum(agent.status().completed for agent in agents) >= 6
    if used == {"topk"}:  # each agent kept the job's error-feedback residual between tasks
        assert all(any((tmp_path / f"agent-{i}").rglob("feedback/*.safetensors")) for i in (0, 1))


def test_agents_build_round_one_and_fetch_later_rounds_as_deltas(
    live_server, make_user, submit, tmp_path, monkeypatch
) -> None:
    """Delta delivery end to end: each agent's sandboxed runner builds round 1's model from
    the seed, rebuilds later ones from int8 deltas, and checks every one by hash (a wrong
    model would fail the task as corrupt_input, and the job would not complete this way)."""
    from marketplace.rounds.models import ModelCopy

    _, provider_key = make_user("provider")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["compression"] = {"download_codec": "int8"}
    spec["rounds"] = {"max_rounds": 3}
    job = submit(spec=spec, tier="platform")
    agents = _run_to_completion(job["id"], live_server.url, provider_key, tmp_path, monkeypatch,
                                "platform")  # fmt: skip
    logs = [e.message for agent in agents for e in agent.logs(500)]
    assert any("built here from the job's seed" in m for m in logs)
    assert any("came as 1 delta(s)" in m for m in logs), logs
    assert not any("corrupt" in m for m in logs)
    stored = Job.objects.get(pk=job["id"])
    assert stored.rounds_done == 3
    copies = ModelCopy.objects.filter(job=stored)
    assert copies.count() == 2 and {c.round_number for c in copies} <= {2, 3}


def test_real_agents_train_then_evaluate_then_predict(
    live_server, make_user, submit, buyer, tmp_path, monkeypatch
) -> None:
    """Every job kind end to end with the real agent and its sandboxed runner: a training
    job, then an evaluation and an inference of its final model."""
    from trainer.datasets import load_dataset
    from trainer.models import build_model
    from trainer.scoring import evaluate_rows, in_row_order, predict
    from trainer.spec import DatasetSpec, parse_spec
    from trainer.updates import decode_state

    _, provider_key = make_user("provider")
    trained = submit(spec=SMALL_SPEC, tier="platform")
    _run_to_completion(trained["id"], live_server.url, provider_key, tmp_path / "train",
                       monkeypatch, "platform")  # fmt: skip
    scoring = {}
    for kind in ("evaluate", "inference"):
        spec = {"name": kind, "kind": kind, "source": {"job": trained["id"]},
                "dataset": {"kind": "digits"}, "sharding": {"num_shards": 3}}  # fmt: skip
        scoring[kind] = submit(spec=spec, tier="platform")
        _run_to_completion(scoring[kind]["id"], live_server.url, provider_key,
                           tmp_path / kind, monkeypatch, "platform")  # fmt: skip

    model = build_model(parse_spec(SMALL_SPEC).model, (64,), 10, seed=0)
    model.load_state_dict(decode_state(buyer.get(f"/api/v1/jobs/{trained['id']}/model").content)[0])
    data = load_dataset(DatasetSpec(kind="digits"), seed=0)
    reference = evaluate_rows(model, data)
    result = buyer.get(f"/api/v1/jobs/{scoring['evaluate']['id']}/").json()["result"]
    assert (result["correct"], result["total"]) == (reference.correct, 1797)
    # the agents ran in other processes (same CPU kind): the sums agree to rounding
    assert result["loss"] == pytest.approx(reference.evaluation.loss, rel=1e-6)
    download = buyer.get(f"/api/v1/jobs/{scoring['inference']['id']}/predictions")
    import io

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(download.content))
    assert table.column("row").to_pylist() == list(range(1797))
    labels = predict(model, in_row_order(data)[0]).labels.tolist()
    assert table.column("prediction").to_pylist() == labels


def test_real_agents_run_a_sweeps_trials_to_its_best(
    live_server, make_user, submit, buyer, tmp_path, monkeypatch
) -> None:
    """kind: sweep end to end: its trials are training jobs the real agents' sandboxed
    runners train like any other; the sweep reports its best trial and takes its model."""
    from marketplace.sweeps.models import SweepTrial
    from tests.marketplace.test_sweep_jobs import sweep_spec

    _, provider_key = make_user("provider")
    spec = sweep_spec(trials=3, parallel=2)
    spec["rounds"] = {"max_rounds": 2, "target": {"metric": "accuracy", "value": 0.99}}
    spec["sharding"] = {"method": "stratified", "num_shards": 2}
    sweep = submit(spec=spec, tier="platform", budget="30")
    _run_to_completion(sweep["id"], live_server.url, provider_key, tmp_path, monkeypatch,
                       "platform")  # fmt: skip
    trials = list(SweepTrial.objects.filter(sweep_id=sweep["id"]).select_related("job"))
    assert len(trials) == 3 and {t.state for t in trials} <= {"completed", "pruned"}
    for t in trials:  # scheduled to the agents like any job
        assert t.job is not None and t.job.parent_id is not None
        done = Task.objects.filter(round__job=t.job, status="done").select_related("node")
        assert done.exists() and {d.node.name for d in done} <= {"agent-0", "agent-1"}
    detail = buyer.get(f"/api/v1/jobs/{sweep['id']}/").json()
    best = detail["best_trial"]
    assert best is not None and detail["trials"][best]["state"] == "completed"
    assert detail["model_hash"] == Job.objects.get(pk=detail["trials"][best]["job"]).model_hash
