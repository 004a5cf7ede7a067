"""An ended job's working files are deleted; the final model and provenance stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.rounds.aggregation import provenance_name
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Round, RoundStatus
from marketplace.rounds.retention import stored_names
from tests.marketplace.test_job_flow import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_grace(own_media, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"ENDED_JOB_FILES_GRACE_S": 0}


def job_files(job_id: str) -> set[str]:
    return set(stored_names(files.job_dir(job_id)))


def test_a_cancelled_jobs_files_are_deleted(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform")
    agent.work(agent.claim())  # an update on disk, besides the shards and round 1's model
    before = job_files(job["id"])
    assert any("/updates/" in n for n in before) and any("/models/" in n for n in before)
    assert buyer.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200

    assert tick()["pruned"] == len(before)
    assert job_files(job["id"]) == set()
    assert Job.objects.get(pk=job["id"]).files_pruned_at is not None
    assert tick()["pruned"] == 0  # once


def test_a_completed_job_keeps_its_model_and_provenance(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")
    run_until_idle(agents)
    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed"
    kept = {done.model_file, provenance_name(done)}
    assert kept < job_files(job["id"])

    assert tick()["pruned"] > 0
    assert job_files(job["id"]) == kept
    assert buyer.get(f"/api/v1/jobs/{job['id']}/model").status_code == 200
    assert buyer.get(f"/api/v1/jobs/{job['id']}/provenance").status_code == 200


def test_pruning_waits_for_the_grace_period_and_a_running_aggregation(
    make_agent, submit, buyer, settings
) -> None:
    job = submit(tier="platform")
    assert buyer.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    before = job_files(job["id"])
    settings.GPUFLEX = settings.GPUFLEX | {"ENDED_JOB_FILES_GRACE_S": 600}
    assert tick()["pruned"] == 0 and job_files(job["id"]) == before

    settings.GPUFLEX = settings.GPUFLEX | {"ENDED_JOB_FILES_GRACE_S": 0}
    Round.objects.filter(job_id=job["id"]).update(status=RoundStatus.AGGREGATING)
    Job.objects.filter(pk=job["id"]).update(finished_at=timezone.now() - timedelta(hours=1))
    assert tick()["pruned"] == 0 and job_files(job["id"]) == before
