"""A job's model is built by a worker after the submission commits, never in the request."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.jobs.preparation import prepare_job
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Round
from tests.marketplace.helpers import SMALL_SPEC


def post(buyer):
    body = {"spec": SMALL_SPEC, "max_price_per_gpu_hour": "1.00", "budget": "10"}
    return buyer.post("/api/v1/jobs/", body, format="json")


def test_the_request_stores_the_job_and_a_worker_opens_round_one(
    buyer, django_capture_on_commit_callbacks, monkeypatch
) -> None:
    from marketplace.jobs import preparation

    built: list[object] = []
    real = preparation.build_model

    def counted(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(preparation, "build_model", counted)
    with django_capture_on_commit_callbacks() as sent:
        response = post(buyer)
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert not built and not Round.objects.exists()  # the request built nothing
    # nor read the dataset into tensors (issue 36: the web process imports no torch)
    assert job.shards.count() == 0 and not job.footprint and job.status == "running"

    for send in sent:  # the commit's messages (the preparation, live-page rings), run eagerly
        send()
    assert len(built) == 1
    assert job.shards.count() == 3  # the worker checked, measured and cut it first
    rnd = Round.objects.get(job=job)
    assert rnd.number == 1 and rnd.status == "open" and rnd.tasks.count() == 3


def test_preparing_twice_opens_one_round(buyer, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert post(buyer).status_code == 201
    job = Job.objects.get()
    assert prepare_job(job.pk) is None  # a redelivered message
    assert Round.objects.filter(job=job).count() == 1


def test_the_tick_sends_a_lost_preparation_again(
    buyer, django_capture_on_commit_callbacks, settings
) -> None:
    with django_capture_on_commit_callbacks():  # the message is lost with its broker
        assert post(buyer).status_code == 201
    job = Job.objects.get()
    with django_capture_on_commit_callbacks(execute=True):
        tick()
    assert not Round.objects.exists()  # too young: its message may still be queued

    Job.objects.filter(pk=job.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.GPUFLEX["STUCK_AGGREGATION_S"] + 1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        tick()
    assert Round.objects.get(job=job).number == 1


def test_a_job_waiting_for_its_model_shows_everywhere(
    buyer, django_capture_on_commit_callbacks
) -> None:
    """Between the submission and the worker, the job has no round: nothing breaks on that."""
    from django.test import Client

    with django_capture_on_commit_callbacks():
        job_id = post(buyer).json()["id"]
    detail = buyer.get(f"/api/v1/jobs/{job_id}/")
    assert detail.status_code == 200 and detail.json()["rounds_done"] == 0
    assert buyer.get(f"/api/v1/jobs/{job_id}/rounds/").json()["results"] == []
    assert buyer.get("/api/v1/jobs/").status_code == 200
    web = Client()
    web.force_login(Job.objects.get().buyer)
    for page in (f"/jobs/{job_id}/", f"/jobs/{job_id}/live/", "/jobs/"):
        assert web.get(page).status_code == 200, page
