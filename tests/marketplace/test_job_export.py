"""A job run to completion through the real API, then: its rounds in the trackers it asked for
(read back with MLflow's and TensorBoard's own readers), its model in every download format
(read back by each format's own library), and `jobs export` after the fact."""

from __future__ import annotations

import contextlib
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from django.conf import settings
from django.core.wsgi import get_wsgi_application

from marketplace.client import Client
from marketplace.jobs.models import Job
from marketplace.ledger.selectors import job_costs
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from trainer.export import TrainedModel
from trainer.spec import ModelSpec
from trainer.tracking import JOB_TAG, check_public_url

pytestmark = pytest.mark.django_db(transaction=True)

TRACKED = SMALL_SPEC | {"tracking": {"backends": ["mlflow", "tensorboard", "wandb"],
                                     "experiment": "digits-team"}}  # fmt: skip


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.fixture
def finished(make_agent, submit) -> Job:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(TRACKED, tier="platform")
    run_until_idle(agents)
    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed" and done.rounds_done == 2
    return done


def test_rounds_are_tracked_as_they_close(finished: Job) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    base = Path(settings.DATA_DIR) / "tracking" / str(finished.pk)
    client = MlflowClient(tracking_uri=f"file:{base / 'mlflow'}")
    exp = client.get_experiment_by_name("digits-team")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags[JOB_TAG] == str(finished.pk) and run.info.status == "FINISHED"
    assert run.data.params["optimizer.lr"] == "0.2"
    rid = run.info.run_id
    acc = client.get_metric_history(rid, "accuracy")
    assert [m.step for m in acc] == [1, 2]
    assert acc[-1].value == finished.rounds.get(number=2).metrics["accuracy"]
    assert [m.value for m in client.get_metric_history(rid, "nodes")] == [3, 3]
    assert all(m.value > 0 for m in client.get_metric_history(rid, "upload_bytes"))
    cost = client.get_metric_history(rid, "cost")
    assert cost[0].value < cost[1].value == pytest.approx(float(job_costs(finished).spent))
    assert [a.path for a in client.list_artifacts(rid)] == [f"{finished.pk}.safetensors"]

    events = EventAccumulator(str(base / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("nodes")] == [(1, 3.0), (2, 3.0)]
    assert {"accuracy", "loss", "cost", "upload_bytes"} <= set(events.Tags()["scalars"])

    # W&B offline: logged once, when the job ended (offline runs cannot be reopened)
    assert len(list((base / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))) == 1


def test_model_downloads_in_every_format(finished: Job, buyer) -> None:
    import onnxruntime as ort
    from safetensors.torch import load

    url = f"/api/v1/jobs/{finished.pk}/model"
    stored = buyer.get(url).content
    assert buyer.get(url, {"format": "safetensors"}).content == stored
    model = TrainedModel.from_bytes(stored, ModelSpec(**SMALL_SPEC["model"]))
    assert load(stored).keys() == model.state.keys()
    x = model.example_input(batch=4)
    with torch.no_grad():
        expected = model.module()(x).numpy()

    onnx = buyer.get(url, {"format": "onnx"})
    assert onnx.status_code == 200 and onnx["Content-Disposition"].endswith('.onnx"')
    session = ort.InferenceSession(onnx.content, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert buyer.get(url, {"format": "onnx"}).content == onnx.content  # kept, not re-exported

    ts = buyer.get(url, {"format": "torchscript"})
    assert ts.status_code == 200
    with pytest.warns(DeprecationWarning), torch.no_grad():
        scripted = torch.jit.load(io.BytesIO(ts.content))
    np.testing.assert_allclose(scripted(x).detach().numpy(), expected, rtol=1e-5, atol=1e-6)

    hf = buyer.get(url, {"format": "hf"})
    assert hf.status_code == 400 and hf.json()["parameter"] == "format"
    assert "model.arch 'mlp'" in hf.json()["detail"]
    bad = buyer.get(url, {"format": "pickle"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_format"
    assert bad.json()["detail"].startswith("format:")


def test_job_page_lists_the_download_formats(finished: Job) -> None:
    from django.test import Client as WebClient

    web = WebClient()
    web.force_login(finished.buyer)
    page = web.get(f"/jobs/{finished.pk}/").content.decode()
    for fmt in ("safetensors", "onnx", "torchscript"):
        assert f'?format={fmt}"' in page
    assert "?format=hf" not in page  # an MLP has no Hugging Face architecture


def test_jobs_export_after_the_fact(finished: Job, tmp_path: Path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from marketplace.accounts.services import issue_user_key

    monkeypatch.chdir(tmp_path)
    _, key = issue_user_key(finished.buyer, "export")
    transport = httpx.WSGITransport(app=get_wsgi_application())
    with Client("http://testserver", key, transport=transport) as sdk:
        uri = sdk.export(str(finished.pk), "mlflow")
        logdir = sdk.export(str(finished.pk), "tensorboard")

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("digits-team").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    events = EventAccumulator(logdir)
    events.Reload()
    assert [e.step for e in events.Scalars("accuracy")] == [1, 2]


def test_a_job_cannot_make_the_server_call_its_own_network(
    make_agent, submit, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """mlflow_uri on a loopback address: the rounds run, and nothing is sent there."""
    from marketplace.jobs import tracking

    def never(*_a, **_k):
        raise AssertionError("the tracker was made for a private address")

    monkeypatch.setattr(tracking, "MLflowTracker", never)
    spec = SMALL_SPEC | {"tracking": {"backends": ["mlflow"], "mlflow_uri": "http://127.0.0.1:9/"}}
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(spec, tier="platform")
    run_until_idle(agents)
    assert Job.objects.get(pk=job["id"]).status == "completed"
    assert "'127.0.0.1' is 127.0.0.1, not a public address" in caplog.text


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Each request's path into the server's `seen`; answers with the server's `reply`."""

    def _answer(self) -> None:
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        status, headers = self.server.reply(self.path)  # type: ignore[attr-defined]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        body = b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}'
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _http(reply) -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen, server.reply = [], reply  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_tracking_server_cannot_redirect_the_server_into_its_own_network(
    submit, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """#38 finding 9: a public mlflow_uri answering 307 to a loopback address was followed
    there; only the first host was checked."""
    from marketplace.jobs import tracking

    monkeypatch.setenv("MLFLOW_ALLOW_HTTP_REDIRECTS", "true")  # MLflow's default; restored after
    with _http(lambda path: (404, {})) as internal:
        port = internal.server_address[1]
        target = {"Location": f"http://localhost:{port}/internal"}
        with _http(lambda path: (307, target)) as public:
            uri = f"http://127.0.0.1:{public.server_address[1]}/"

            # the buyer's server passes the check as a public address would; what it
            # redirects to is this machine's own
            def public_first_host(url: str) -> None:
                check_public_url(url, resolve=lambda host, port: [(0, 0, 0, "", ("8.8.8.8", 0))])

            monkeypatch.setattr(tracking, "check_public_url", public_first_host)
            spec = SMALL_SPEC | {"tracking": {"backends": ["mlflow"], "mlflow_uri": uri}}
            job = submit(spec)
            tracking.track_round(job["id"], 1)  # never raises: tracking is best-effort
            assert public.seen, "the tracker never called the buyer's server"
    assert internal.seen == []
    assert "tracking to mlflow failed" in caplog.text
