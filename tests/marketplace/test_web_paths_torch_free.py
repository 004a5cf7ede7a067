"""A web process leases work, serves downloads and shows a job's provenance without importing
torch (issue 36). A node that came online after its round opened is not in the round's plan,
so its claim sizes its work through the planner, which takes the model's size from the stored
model's header (jobs/model_headers.py) instead of building the model. On the code before this
change the claim imported torch (rounds/sizing.model_numel, trainer.local.planned_steps), so
did the model download's module (trainer.export, for the formats' names) and the job page's
provenance check (trainer.provenance). An ONNX or TorchScript download is the worker's to make:
the web process answers 202 and sends one message per export, and serves the file once made."""

from __future__ import annotations

import copy

import pytest

from marketplace.jobs.model_headers import stored_numel
from marketplace.rounds.models import Round, Task, TaskStatus
from marketplace.rounds.sizing import model_numel
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.web_process import run_web

_WEB = """
from django.test import Client

client = Client(HTTP_AUTHORIZATION="Bearer " + os.environ["KEY"])
response = client.post("/api/v1/agent/claim?wait=0")
out = {"status": response.status_code, "body": response.json() if response.content else None}
# the model download's module (GET jobs/<id>/model): a safetensors download is the stored file
from marketplace.jobs.export import formats_for, job_model_download  # noqa: F401
"""


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_late_node_claims_network_aware_work_without_torch(
    tmp_path, own_media, make_agent, submit
) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the web process reads the test database over PostgreSQL")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2}
    job = submit(spec=spec, tier="platform")
    rnd = Round.objects.get(job_id=job["id"], number=1)
    late = make_agent(kind="platform")  # online after the round's plan was made
    assert f"n{late.node_id}" not in (rnd.plan or {})
    # the header's count is the built model's, which the worker's planner uses
    j = rnd.job
    assert stored_numel(rnd.input_model_file) == model_numel(
        j.parsed_spec.model.model_dump_json(), tuple(j.input_shape), j.num_classes
    )
    out = run_web(_WEB, tmp_path, KEY=late.key)
    assert out["status"] == 200, out
    assert out["heavy"] == [], out["first"][0]
    leased = Task.objects.get(pk=out["body"]["task"]["id"])
    assert leased.status == TaskStatus.LEASED and leased.node_id == late.node_id
    assert leased.steps is not None and leased.steps >= 2  # sized by the planner


_PAGE = """
from marketplace.jobs.models import Job
from marketplace.web.jobview import live_payload

payload = live_payload(Job.objects.get(pk=os.environ["JOB"]))
out = {"provenance": payload["provenance"]}
"""


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_finished_jobs_page_checks_its_provenance_without_torch(
    tmp_path, own_media, make_agent, submit
) -> None:
    """The buyer's job page reads and checks the job's provenance chain (its links and record
    hashes) in the web process: trainer.provenance_chain, not the replay's torch."""
    from django.db import connection

    from tests.marketplace.test_job_flow import run_until_idle

    if connection.vendor != "postgresql":
        pytest.skip("the web process reads the test database over PostgreSQL")
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")
    assert run_until_idle(agents) > 0
    out = run_web(_PAGE, tmp_path, JOB=job["id"])
    assert out["heavy"] == [], out["first"][0]
    chain = out["provenance"]
    assert chain["ok"] is True and chain["count"] >= 1, chain


_EXPORT = """
from django.test import Client

client = Client(HTTP_AUTHORIZATION="Bearer " + os.environ["KEY"])
url = f"/api/v1/jobs/{os.environ['JOB']}/model"
answers = [client.get(url, {"format": f}) for f in os.environ["FORMATS"].split()]
out = {"answers": [{"status": a.status_code, "retry_after": a.get("Retry-After"),
                    "body": a.json() if a.status_code != 200 else None,
                    "size": len(a.content)} for a in answers]}
"""


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_an_onnx_or_torchscript_download_is_left_to_the_worker(tmp_path, own_media, submit) -> None:
    """The web process records the request and sends the worker one message per export,
    answering 202 without importing torch; once the worker has made it, the same request
    downloads it, still without torch (issue 36)."""
    from django.db import connection

    from marketplace.accounts.services import issue_user_key
    from marketplace.jobs import files
    from marketplace.jobs.export import export_name
    from marketplace.jobs.export_making import make_export
    from tests.marketplace.test_model_export_requests import with_model

    if connection.vendor != "postgresql":
        pytest.skip("the web process reads the test database over PostgreSQL")
    job = with_model(submit()["id"])
    _, key = issue_user_key(job.buyer, "web")
    env = {"KEY": key, "JOB": str(job.pk)}
    out = run_web(_EXPORT, tmp_path, FORMATS="onnx torchscript onnx", **env)
    assert out["heavy"] == [], out["first"][0]
    assert [a["status"] for a in out["answers"]] == [202, 202, 202], out
    assert all(a["retry_after"] == "5" for a in out["answers"])
    assert [a["body"]["format"] for a in out["answers"]] == ["onnx", "torchscript", "onnx"]
    # one message per export in the web process's broker, however often it was asked
    assert len(list((tmp_path / "broker" / "queue").iterdir())) == 2

    make_export(job.pk, "onnx")  # the worker takes the onnx message
    out = run_web(_EXPORT, tmp_path, FORMATS="onnx torchscript", **env)
    assert out["heavy"] == [], out["first"][0]
    onnx, torchscript = out["answers"]
    assert onnx["status"] == 200
    assert onnx["size"] == len(files.get(export_name(job.pk, job.model_hash, "onnx")))
    assert torchscript["status"] == 202  # still its worker's to make
    assert len(list((tmp_path / "broker" / "queue").iterdir())) == 2
