"""A web process takes a node's update without importing torch (issue 36): the request
checks what needs no torch (ownership, idempotency, size, metrics, the safetensors header)
and stores the bytes as received; the worker's check (rounds.update_checks) decodes them
against the round's model. On the code before this change the upload view imported torch
(trainer.hashing, the decoding), and this test fails there."""

from __future__ import annotations

import json

import pytest

from marketplace.rounds.models import ReceivedUpdate, Task, TaskResult, TaskStatus
from marketplace.rounds.update_checks import check_received
from tests.marketplace.web_process import run_web

# the web process: the WSGI app's settings, the Django test client through every layer (auth,
# throttles, the view, the service); the broker replaced by a list, as the worker is not
# what this process runs
_WEB = """
from celery import current_app
from django.test import Client
from marketplace.server.routing import CHECK_UPDATE

sent = []
current_app.tasks[CHECK_UPDATE].delay = sent.append
client = Client(HTTP_AUTHORIZATION="Bearer " + os.environ["KEY"])
out = {"status": []}
for name in ("cut", "good", "good", "other"):
    with open(os.path.join(os.environ["BODIES"], name), "rb") as f:
        body = f.read()
    response = client.put(
        "/api/v1/agent/tasks/" + os.environ["TASK"] + "/update", data=body,
        content_type="application/octet-stream", HTTP_X_GPUFLEX_METRICS=os.environ["METRICS"],
    )
    out["status"].append([response.status_code, response.json()])
out["sent"] = sent
# what the agent asks after a 202 (desktop.upload_outcomes): the same process, no torch
out["outcome"] = client.get("/api/v1/agent/tasks/" + os.environ["TASK"] + "/update").json()
"""


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_web_process_takes_updates_without_torch(tmp_path, own_media, make_agent, submit) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the web process reads the test database over PostgreSQL")
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload, metrics = agent.train(task)
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    (bodies / "cut").write_bytes(payload[:-4])  # a transfer cut short
    (bodies / "good").write_bytes(payload)
    (bodies / "other").write_bytes(payload[:-4] + b"\0\0\0\0")
    out = run_web(
        _WEB, tmp_path, KEY=agent.key, TASK=task["id"], METRICS=json.dumps(metrics),
        BODIES=str(bodies),
    )  # fmt: skip
    assert out["heavy"] == [], out["first"][0]
    (cut, refusal), (good, _), (again, _), (other, conflict) = out["status"]
    # the header alone shows the cut: refused at once, the problem named
    assert cut == 422 and refusal["reason"] == "corrupt", refusal
    assert "not a safetensors file" in refusal["detail"] and "tensor '" in refusal["detail"]
    # received, the same bytes again received (idempotent), other bytes a conflict
    assert (good, again, other) == (202, 202, 409), out["status"]
    assert conflict["error"] == "conflict"
    assert out["sent"] == [task["id"]]  # one check sent, for the first receipt
    assert out["outcome"]["status"] == "checking", out["outcome"]
    received = ReceivedUpdate.objects.get(task_id=task["id"])
    assert Task.objects.get(pk=task["id"]).status == TaskStatus.LEASED  # still in flight
    # what the worker does with the message: decoded, accepted, the task done
    check_received(task["id"])
    result = TaskResult.objects.get(task_id=task["id"])
    assert result.update_hash == received.update_hash
    assert result.compute_s == received.compute_s and result.metrics == received.metrics
    assert Task.objects.get(pk=task["id"]).status == TaskStatus.DONE
    assert not ReceivedUpdate.objects.exists()
    # a retry after the check: the same bytes are the accepted ones
    assert agent.upload(task["id"], payload, metrics).status_code == 200
