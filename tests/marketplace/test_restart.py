"""After a crash of the web server, the workers or the host, jobs resume from their
checkpoint: the periodic tick finds what was interrupted and finishes it exactly once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.rounds import aggregation, tasks
from marketplace.rounds.aggregation import artifact_store, read_checkpoint
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Round, Task
from trainer.hashing import state_hash
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.spec import parse_spec

pytestmark = pytest.mark.django_db(transaction=True)


def finish_round(agents) -> None:
    """One task per agent: three platform nodes, three shards, one round."""
    for agent in agents:
        assert agent.work(agent.claim()).status_code == 202


@pytest.fixture
def agents(make_agent):
    return [make_agent(kind="platform") for _ in range(3)]


def age_aggregation() -> None:
    Round.objects.filter(status="aggregating").update(
        aggregating_since=timezone.now() - timedelta(hours=1)
    )


def test_worker_lost_before_aggregating(agents, submit, monkeypatch) -> None:
    job = submit(tier="platform")
    with monkeypatch.context() as m:  # the enqueued aggregation is lost with its worker
        m.setattr(tasks.aggregate_round, "delay", lambda *a, **k: None)
        finish_round(agents)
    assert Round.objects.get(number=1).status == "aggregating"
    assert tick()["restarted"] == 0  # not yet considered stuck
    age_aggregation()
    assert tick()["restarted"] == 1
    assert Round.objects.get(number=1).status == "done"
    assert Round.objects.get(number=2).status == "open"
    assert Job.objects.get(pk=job["id"]).rounds_done == 1


def test_crash_after_checkpoint_does_not_aggregate_twice(agents, submit, monkeypatch) -> None:
    job = submit(tier="platform")

    def crash(*args, **kwargs):
        raise RuntimeError("host lost power")

    with monkeypatch.context() as m:
        m.setattr(aggregation, "_settle_results", crash)
        # the aggregation runs eagerly on the last upload's commit (a worker, in production):
        # its crash is answered as a logged JSON 500, the update itself already stored
        statuses = [agent.work(agent.claim()).status_code for agent in agents]
        assert statuses == [202, 202, 500]
    db_job = Job.objects.get(pk=job["id"])
    assert read_checkpoint(db_job).round == 1  # the checkpoint got written
    assert Round.objects.get(number=1).status == "aggregating"

    age_aggregation()
    tick()
    db_job.refresh_from_db()
    assert db_job.rounds_done == 1 and Round.objects.get(number=2).status == "open"
    ckpt = read_checkpoint(db_job)
    assert state_hash(ckpt.model_state) == db_job.model_hash
    chain = ProvenanceChain.from_json(ckpt.extra["provenance"])
    assert [r.round for r in chain] == [1]

    finish_round(agents)  # and the job carries on to the end
    db_job.refresh_from_db()
    assert db_job.status == "completed" and db_job.rounds_done == 2
    chain = ProvenanceChain.from_json(read_checkpoint(db_job).extra["provenance"])
    report = verify_with_artifacts(chain, artifact_store(), parse_spec(db_job.spec).aggregation)
    assert report.ok, str(report)


def test_running_job_without_a_round_resumes_from_its_checkpoint(agents, submit) -> None:
    job = submit(tier="platform")
    finish_round(agents)  # round 1 done, round 2 open
    # as if the host died after the checkpoint and before round 2 existed
    Task.objects.filter(round__number=2).delete()
    Round.objects.filter(number=2).delete()
    assert tick()["resumed"] == 1
    db_job = Job.objects.get(pk=job["id"])
    second = Round.objects.get(job=db_job, number=2)
    assert second.status == "open" and second.input_model_hash == db_job.model_hash
    assert second.tasks.count() == 3
    finish_round(agents)
    db_job.refresh_from_db()
    assert db_job.status == "completed"
