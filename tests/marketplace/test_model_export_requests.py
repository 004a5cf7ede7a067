"""onnx / torchscript / hf downloads are made by the worker, never the web request (issue 36):
the request records what it wants and answers 202 with Retry-After, sends one message however
often it is asked, sends another only long after (a lost message), and downloads the export
once it is made; an export that fails is a 400 naming `format`; a newer model exports anew;
the SDK waits through the 202s.

These tests run inside a transaction, so a message sent on commit is captured, not run: the
test runs it (eager Celery, the worker's own task) where the worker would."""

from __future__ import annotations

import datetime

import httpx
import pytest
from django.core.files.storage import default_storage
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from marketplace.accounts.services import issue_user_key
from marketplace.client import Client, ExportNotReady
from marketplace.jobs import files
from marketplace.jobs.export import export_name
from marketplace.jobs.export_making import MAX_STARTS, make_export
from marketplace.jobs.export_requests import STALE_AFTER
from marketplace.jobs.models import ExportStatus, Job, ModelExport
from marketplace.jobs.models_io import store_model
from marketplace.rounds.models import Round
from trainer.updates import decode_state, encode_state

pytestmark = pytest.mark.django_db


def with_model(job_id: str) -> Job:
    """The job's model set to round 1's (the seed's), as a scoring job's is: a model to
    download without running rounds."""
    rnd = Round.objects.get(job_id=job_id, number=1)
    Job.objects.filter(pk=job_id).update(
        model_hash=rnd.input_model_hash, model_file=rnd.input_model_file
    )
    return Job.objects.get(pk=job_id)


@pytest.fixture
def job(submit, own_media) -> Job:
    return with_model(submit()["id"])


def _url(job: Job) -> str:
    return f"/api/v1/jobs/{job.pk}/model"


def test_the_export_is_made_by_the_worker_while_the_request_answers_202(
    job: Job, buyer, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks() as sent:
        first = buyer.get(_url(job), {"format": "onnx"})
        again = buyer.get(_url(job), {"format": "onnx"})
    for answer in (first, again):
        assert answer.status_code == 202, answer.content
        assert answer["Retry-After"] == "5"
        body = answer.json()
        assert body["status"] == "exporting" and body["format"] == "onnx"
        assert body["model_hash"] == job.model_hash and body["retry_after"] == 5
        assert "being made" in body["detail"]
    assert len(sent) == 1  # asked twice, sent once
    record = ModelExport.objects.get(job=job, format="onnx")
    assert record.status == ExportStatus.PENDING and record.model_hash == job.model_hash
    assert not default_storage.exists(export_name(job.pk, job.model_hash, "onnx"))

    sent[0]()  # the worker takes the message
    record.refresh_from_db()
    assert record.status == ExportStatus.DONE and record.starts == 1
    done = buyer.get(_url(job), {"format": "onnx"})
    assert done.status_code == 200 and done["Content-Disposition"].endswith('.onnx"')
    assert done["X-GPUFlex-Model-Hash"] == job.model_hash
    assert done.content == files.get(export_name(job.pk, job.model_hash, "onnx"))
    sent[0]()  # a redelivered message leaves a finished export alone
    record.refresh_from_db()
    assert record.status == ExportStatus.DONE and record.starts == 1

    # a newer model (the next round's): exported anew, under its own hash
    state, _ = decode_state(files.get(job.model_file))
    newer = {k: v + 1 for k, v in state.items()}
    job.model_hash, job.model_file = store_model(job, 2, newer)
    job.save(update_fields=["model_hash", "model_file"])
    with django_capture_on_commit_callbacks() as sent:
        pending = buyer.get(_url(job), {"format": "onnx"})
    assert pending.status_code == 202 and pending.json()["model_hash"] == job.model_hash
    assert len(sent) == 1
    sent[0]()
    fresh = buyer.get(_url(job), {"format": "onnx"})
    assert fresh.status_code == 200 and fresh["X-GPUFlex-Model-Hash"] == job.model_hash
    assert fresh.content != done.content


def test_a_failed_export_is_a_400_naming_the_format(
    job: Job, buyer, django_capture_on_commit_callbacks
) -> None:
    """A stored model without its input shape (as a model file written before the metadata
    was kept) cannot be rebuilt: the worker records why, and the buyer reads it."""
    state, _ = decode_state(files.get(job.model_file))
    name = f"{files.job_dir(job.pk)}/models/no-metadata.safetensors"
    files.put(name, encode_state(state, {}))
    Job.objects.filter(pk=job.pk).update(model_hash="0" * 64, model_file=name)
    job.refresh_from_db()

    with django_capture_on_commit_callbacks(execute=True) as sent:
        assert buyer.get(_url(job), {"format": "torchscript"}).status_code == 202
    assert len(sent) == 1  # run as it was sent: the worker failed it
    with django_capture_on_commit_callbacks() as sent:
        failed = buyer.get(_url(job), {"format": "torchscript"})
        again = buyer.get(_url(job), {"format": "torchscript"})
    assert sent == []  # a failure is not retried for the same model
    for answer in (failed, again):
        assert answer.status_code == 400, answer.content
        body = answer.json()
        assert body["error"] == "invalid_format" and body["parameter"] == "format"
        assert body["detail"].startswith("format: the model file lacks its input shape")


def test_a_lost_message_or_file_is_sent_again(
    job: Job, buyer, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks() as sent:
        assert buyer.get(_url(job), {"format": "onnx"}).status_code == 202
    assert len(sent) == 1  # and lost: never run
    record = ModelExport.objects.get(job=job, format="onnx")
    ModelExport.objects.filter(pk=record.pk).update(
        requested_at=record.requested_at - STALE_AFTER - datetime.timedelta(seconds=1)
    )
    with django_capture_on_commit_callbacks() as sent:
        assert buyer.get(_url(job), {"format": "onnx"}).status_code == 202
        assert buyer.get(_url(job), {"format": "onnx"}).status_code == 202
    assert len(sent) == 1  # once more, then waited on again
    sent[0]()
    assert buyer.get(_url(job), {"format": "onnx"}).status_code == 200

    # a made export whose file is gone (storage restored from an older backup): made again
    default_storage.delete(export_name(job.pk, job.model_hash, "onnx"))
    with django_capture_on_commit_callbacks() as sent:
        assert buyer.get(_url(job), {"format": "onnx"}).status_code == 202
    assert len(sent) == 1
    sent[0]()
    assert buyer.get(_url(job), {"format": "onnx"}).status_code == 200


def test_an_export_whose_worker_keeps_dying_fails_with_the_reason(
    job: Job, buyer, django_capture_on_commit_callbacks
) -> None:
    """A worker killed mid-export (out of memory) has its message redelivered: each start is
    counted, and past MAX_STARTS the export fails instead of killing workers for ever."""
    with django_capture_on_commit_callbacks():
        assert buyer.get(_url(job), {"format": "onnx"}).status_code == 202
    ModelExport.objects.filter(job=job, format="onnx").update(starts=MAX_STARTS)
    make_export(job.pk, "onnx")  # the message, delivered once more
    failed = buyer.get(_url(job), {"format": "onnx"})
    assert failed.status_code == 400 and failed.json()["parameter"] == "format"
    assert f"stopped without finishing {MAX_STARTS} times" in failed.json()["detail"]


def test_the_client_waits_through_202_as_retry_after_says(
    job: Job, django_capture_on_commit_callbacks, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, key = issue_user_key(job.buyer, "download")
    transport = httpx.WSGITransport(app=get_wsgi_application())
    pauses: list[float] = []

    def worker_runs_meanwhile(seconds: float) -> None:
        """The client's pause: the worker takes the messages sent meanwhile."""
        pauses.append(seconds)
        assert len(pauses) < 5, "the export was made, yet the client still waits"
        for record in ModelExport.objects.filter(status=ExportStatus.PENDING):
            make_export(record.job_id, record.format)

    with django_capture_on_commit_callbacks():
        monkeypatch.setattr("marketplace.client.time.sleep", worker_runs_meanwhile)
        # as Django's test client does: a request leaves the test's transaction open
        for signal in (request_started, request_finished):
            signal.disconnect(close_old_connections)
        try:
            with Client("http://testserver", key, transport=transport) as sdk:
                with pytest.raises(ExportNotReady) as not_ready:
                    sdk.model_bytes(str(job.pk), "torchscript", wait=0)
                data = sdk.model_bytes(str(job.pk), "onnx")
        finally:
            for signal in (request_started, request_finished):
                signal.connect(close_old_connections)
    assert not_ready.value.status == 202 and "torchscript export" in not_ready.value.detail
    assert pauses == [5.0]  # one 202, then the export
    assert data == files.get(export_name(job.pk, job.model_hash, "onnx"))


def test_the_job_pages_link_says_the_export_is_being_made(
    job: Job, django_capture_on_commit_callbacks
) -> None:
    from django.contrib.messages import get_messages
    from django.test import Client as WebClient

    web = WebClient()
    web.force_login(job.buyer)
    url = f"/jobs/{job.pk}/model/"
    with django_capture_on_commit_callbacks() as sent:
        answer = web.get(url, {"format": "onnx"})
    assert answer.status_code == 302 and answer.url == f"/jobs/{job.pk}/"
    (message,) = [str(m) for m in get_messages(answer.wsgi_request)]
    assert "The onnx export of model" in message and "being made" in message
    assert len(sent) == 1
    sent[0]()
    done = web.get(url, {"format": "onnx"})
    assert done.status_code == 200 and done["Content-Disposition"].endswith('.onnx"')


def test_gpuflex_download_refuses_a_wait_that_is_not_seconds(capsys) -> None:
    from marketplace.cli import parser

    for bad in ("-1", "soon", "nan"):
        with pytest.raises(SystemExit):
            parser().parse_args(["download", "JOB", "--wait", bad])
    err = capsys.readouterr().err
    assert "'-1': give 0 or more seconds" in err and "'soon' is not a number of seconds" in err
    assert parser().parse_args(["download", "JOB", "--wait", "30"]).wait == 30.0
