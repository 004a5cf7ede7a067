"""Every spec that validates runs, or is refused at submission with a 400 naming the field:
every example spec, every aggregation strategy, every dataset kind and sharding method."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import torch
import yaml

from marketplace.jobs.models import Job
from marketplace.jobs.submission import (
    BUILTIN_KINDS,
    REFUSED_SHARDING,
    SHARDING_METHODS,
    UPLOAD_KINDS,
)
from marketplace.ledger.models import Transaction, TxKind
from marketplace.rounds.models import Round
from tests.marketplace.helpers import SMALL_SPEC
from trainer.aggregation import ClientUpdate, build_strategy, min_updates, round_size_problems
from trainer.sharding import METHODS
from trainer.spec import AggregationSpec, DatasetKind

# examples that train on files `gpuflex examples write` makes are submitted with them, and
# run, in tests/marketplace/test_example_jobs.py
WITH_FILES = {"stdlib-lm.yaml", "lora-finetune.yaml"}
EXAMPLES = sorted(
    p for p in (Path(__file__).parents[2] / "examples").glob("*.yaml") if p.name not in WITH_FILES
)
# the examples the marketplace refuses, and the field it names
REFUSED_EXAMPLES: dict[str, str] = {}
STRATEGIES = get_args(AggregationSpec.model_fields["strategy"].annotation)


def post(buyer, spec: dict[str, Any] | str, **fields: Any):
    body = {"spec": spec, "max_price_per_gpu_hour": "1.00", "budget": "10"} | fields
    return buyer.post("/api/v1/jobs/", body, format="json")


def refused_by_worker(response) -> str:
    """A job accepted on the request's checks and failed by the worker that prepares it
    (what needs the dataset's rows: issue 36), nothing held; returns its reason."""
    from marketplace.jobs.preparation import prepare_job

    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert prepare_job(job.pk) is None
    job.refresh_from_db()
    assert job.status == "failed" and not Round.objects.filter(job=job).exists()
    return job.error


def refused_fields(response) -> set[str]:
    """The spec fields a 400 names; each is also in the sentence a person reads."""
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid_spec"
    fields = {p["field"] for p in body["problems"]}
    assert fields and all(f in body["detail"] for f in fields)
    return fields


def run_first_round(agents, job_id: str) -> Round:
    """Agents work round 1's tasks until it is aggregated (or nothing is left to claim)."""
    for _ in range(50):
        worked = False
        for agent in agents:
            if Round.objects.get(job_id=job_id, number=1).status != "open":
                return Round.objects.get(job_id=job_id, number=1)
            task = agent.claim()
            if task is not None and task["round"] == 1:
                assert agent.work(task).status_code == 202
                worked = True
        if not worked:
            break
    return Round.objects.get(job_id=job_id, number=1)


def assert_round_one_aggregated(job_id: str, agents) -> None:
    rnd = run_first_round(agents, job_id)
    job = Job.objects.get(pk=job_id)
    assert rnd.status == "done", (rnd.status, rnd.metrics, job.error)
    assert rnd.metrics["participants"] >= 1 and "error" not in rnd.metrics
    assert job.status in ("running", "completed") and job.error == ""


# -- accepted and runs, or refused with the field named ---------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_spec_runs_or_is_refused_by_field(path: Path, buyer, make_agent) -> None:
    text = path.read_text()
    sweep = yaml.safe_load(text).get("kind") == "sweep"
    # a sweep funds several trials at once from its budget
    response = post(buyer, text, tier="platform", budget="40" if sweep else "10")
    if path.name in REFUSED_EXAMPLES:
        assert refused_fields(response) == {REFUSED_EXAMPLES[path.name]}
        assert not Job.objects.exists()
        return
    assert response.status_code == 201, response.content
    shards = yaml.safe_load(text).get("sharding", {}).get("num_shards") or 4
    agents = [make_agent(kind="platform") for _ in range(shards)]
    job_id = response.json()["id"]
    if sweep:  # its trials are the jobs that train: the first one's round 1
        job_id = str(Job.objects.get(parent_id=job_id, sweep_trial__number=0).pk)
    assert_round_one_aggregated(job_id, agents)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_aggregates_a_round(strategy: str, buyer, make_agent) -> None:
    aggregation: dict[str, Any] = {"strategy": strategy}
    sharding = SMALL_SPEC["sharding"]
    if strategy == "krum":  # one Byzantine update of five: n = 5 > 2f + 2
        aggregation["byzantine"] = 1
        sharding = {"method": "stratified", "num_shards": 5}
    spec = SMALL_SPEC | {"aggregation": aggregation, "sharding": sharding}
    response = post(buyer, spec | {"rounds": {"max_rounds": 1}}, tier="platform")
    assert response.status_code == 201, response.content
    agents = [make_agent(kind="platform") for _ in range(sharding["num_shards"])]
    job_id = response.json()["id"]
    assert_round_one_aggregated(job_id, agents)
    assert Job.objects.get(pk=job_id).status == "completed"


def test_every_dataset_kind_and_sharding_method_is_run_or_refused_with_a_reason() -> None:
    """A kind or method the trainer gains must either run here or get a stated reason."""
    assert set(get_args(DatasetKind)) == BUILTIN_KINDS | UPLOAD_KINDS
    assert set(METHODS) == SHARDING_METHODS | set(REFUSED_SHARDING)


@pytest.mark.django_db
@pytest.mark.parametrize("method", sorted(REFUSED_SHARDING))
def test_sharding_methods_the_marketplace_cannot_cut_are_refused(method: str, buyer) -> None:
    response = post(buyer, SMALL_SPEC | {"sharding": {"method": method, "num_shards": 3}})
    assert refused_fields(response) == {"sharding.method"}
    assert REFUSED_SHARDING[method] in response.json()["detail"]


# -- Krum against the updates a round brings --------------------------------------------------


@pytest.mark.django_db
def test_default_krum_on_default_shards_is_refused_naming_byzantine(buyer) -> None:
    """The issue's case: byzantine 2 needs 7 updates, the 4 default shards give 4."""
    spec = SMALL_SPEC | {"aggregation": {"strategy": "krum"}, "sharding": {"method": "random"}}
    detail = refused_by_worker(post(buyer, spec))
    assert "aggregation.byzantine" in detail
    assert "at least 7" in detail and "can count on 4 (4 shards, closing at quorum 1)" in detail
    assert "at most 0" in detail
    holds = Transaction.objects.filter(kind=TxKind.HOLD).count()
    assert Transaction.objects.filter(kind=TxKind.RELEASE).count() == holds == 1


@pytest.mark.django_db
def test_krum_counts_the_quorum_not_all_shards(buyer) -> None:
    five = {"method": "stratified", "num_shards": 5}
    krum = {"strategy": "krum", "byzantine": 1}
    ok = post(buyer, SMALL_SPEC | {"aggregation": krum, "sharding": five})
    assert ok.status_code == 201, ok.content
    # at quorum 0.8 a round closes with 4 of the 5 shards: too few for f = 1
    spec = SMALL_SPEC | {"aggregation": krum, "sharding": five, "rounds": {"quorum": 0.8}}
    detail = refused_by_worker(post(buyer, spec))
    assert "aggregation.byzantine" in detail and "5 shards, closing at quorum 0.8" in detail


@pytest.mark.django_db
def test_krum_select_beyond_a_round_is_refused(buyer) -> None:
    krum = {"strategy": "krum", "byzantine": 0, "krum_select": 4}
    assert "aggregation.krum_select" in refused_by_worker(
        post(buyer, SMALL_SPEC | {"aggregation": krum})
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_round_size_rule_is_what_the_strategy_does(strategy: str) -> None:
    """round_size_problems refuses exactly the round sizes the strategy cannot aggregate."""
    specs = [AggregationSpec(strategy=strategy)]
    if strategy == "krum":
        specs = [AggregationSpec(strategy="krum", byzantine=f) for f in range(4)]
        specs.append(AggregationSpec(strategy="krum", byzantine=1, krum_select=7))
    for spec in specs:
        for n in range(1, 12):
            updates = [ClientUpdate(str(i), {"w": torch.full((3,), float(i))}, 1) for i in range(n)]
            try:
                build_strategy(spec).aggregate({"w": torch.zeros(3)}, updates)
                ran = True
            except ValueError:
                ran = False
            problems = round_size_problems(spec, n)
            assert ran == (not problems) == (n >= min_updates(spec)), (spec, n, problems)
