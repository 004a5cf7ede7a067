"""Submitting a federated job from the CLI, the SDK and the web page; one naming a dataset no
node declares is refused, one whose silos are offline waits and says so."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from django.core.wsgi import get_wsgi_application
from django.test import Client as WebClient

from marketplace import cli
from marketplace.client import Client, GPUFlexError
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from tests.marketplace.test_federated import CLINIC, FEDERATED_SPEC

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {"content_hash": "a" * 64, "kind": "csv", "input_shape": [64], "num_classes": 10}


@pytest.fixture
def buyer_key(make_user):
    return make_user("buyer")


def sdk_for(key: str) -> Client:
    return Client(
        "http://testserver", key, transport=httpx.WSGITransport(app=get_wsgi_application())
    )


def test_sdk_submits_and_the_job_names_its_silos(buyer_key, make_agent) -> None:
    make_agent(local_datasets=[CLINIC[0] | SCHEMA])
    with sdk_for(buyer_key[1]) as sdk:
        job = sdk.submit(FEDERATED_SPEC, budget="10", tier="volunteer", federated="clinic")
        assert job["federated_dataset"] == "clinic"
        detail = sdk.job(job["id"])
    fed = detail["federated"]
    assert (fed["dataset"], fed["silos_online"], fed["silos_declared"]) == ("clinic", 1, 1)
    assert "statistical" in fed["verification"] and "No replicas" in fed["verification"]


def test_cli_submits_with_federated(buyer_key, make_agent, tmp_path, monkeypatch, capsys) -> None:
    make_agent(local_datasets=CLINIC)
    monkeypatch.setattr(cli, "build_client", lambda args: sdk_for(buyer_key[1]))
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(FEDERATED_SPEC))
    argv = ["submit", str(spec), "--budget", "10", "--tier", "volunteer", "--federated", "clinic"]
    assert cli.main(argv) == 0
    assert "submitted" in capsys.readouterr().out
    assert Job.objects.get().federated_dataset == "clinic"


def test_a_dataset_no_node_declares_is_refused(buyer_key, make_agent) -> None:
    make_agent(local_datasets=[{"name": "other", "rows": 10}])
    with sdk_for(buyer_key[1]) as sdk, pytest.raises(GPUFlexError) as refused:
        sdk.submit(FEDERATED_SPEC, budget="10", tier="volunteer", federated="clinic")
    text = str(refused.value)
    assert "no node declares a local dataset named 'clinic'" in text
    assert "gpuflex-node datasets add clinic" in text
    assert not Job.objects.exists()


def test_silos_whose_rows_the_model_cannot_take_are_refused(buyer_key, make_agent) -> None:
    """The model's input is known once the worker has read the job's dataset (issue 36):
    the job fails there, saying why."""
    make_agent(local_datasets=[CLINIC[0] | SCHEMA | {"input_shape": [12]}])
    with sdk_for(buyer_key[1]) as sdk:
        job = sdk.submit(FEDERATED_SPEC, budget="10", tier="volunteer", federated="clinic")
        shown = sdk.job(job["id"])
    assert shown["status"] == "failed"
    assert "rows have shape [12], the job's model takes [64]" in shown["error"]


def test_offline_silos_make_the_job_wait_and_say_so(buyer_key, make_agent) -> None:
    make_agent(local_datasets=[CLINIC[0] | SCHEMA])
    Node.objects.update(last_heartbeat_at=None, state="offline")
    with sdk_for(buyer_key[1]) as sdk:
        job = sdk.submit(FEDERATED_SPEC, budget="10", tier="volunteer", federated="clinic")
        fed = sdk.job(job["id"])["federated"]
    assert fed["silos_online"] == 0 and fed["silos_declared"] == 1
    assert fed["summary"].startswith("waiting: no online node holds the local dataset 'clinic'")


def test_the_web_page_submits_and_the_job_page_says_how_it_is_verified(
    buyer_key, make_agent
) -> None:
    make_agent(local_datasets=CLINIC)
    web = WebClient()
    web.force_login(buyer_key[0])
    form = {"spec": yaml.safe_dump(FEDERATED_SPEC), "tier": "volunteer", "budget": "10",
            "max_price_per_gpu_hour": "1", "federated_dataset": "clinic"}  # fmt: skip
    estimate = web.post("/jobs/estimate/", form)
    assert json.loads(estimate.content)["ok"] is True  # prepartitioned is fine when federated
    page = web.post("/jobs/new/", form)
    assert page.status_code == 302, page.content.decode()[:2000]
    job = Job.objects.get()
    assert job.federated_dataset == "clinic"
    shown = web.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="federated-note"' in shown and "Verification: No replicas" in shown
    assert "1 online node(s) hold the local dataset" in shown
    refused = web.post("/jobs/new/", form | {"federated_dataset": "nowhere"})
    assert "no node declares a local dataset named" in refused.content.decode()
