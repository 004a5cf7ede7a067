"""A web process takes a zone aggregator's partial sum without importing torch (issue 36):
the request reads the safetensors header and the manifest in its metadata
(trainer.zone_manifest), checks the members it names, and stores the bytes as received; the
worker's check (rounds.zone_checks) decodes the sum against the round's model. On the code
before this change the partial's view decoded it with torch in the request, and this test
fails there."""

from __future__ import annotations

import pytest

from marketplace.rounds.models import ReceivedPartial, Task, TaskResult, TaskStatus, ZonePartial
from marketplace.rounds.zone_checks import check_received_partial
from tests.marketplace.web_process import run_web
from tests.marketplace.zone_members import put_partial, zone_round

# the web process: the WSGI app's settings, the Django test client through every layer;
# the broker replaced by a list, as the worker is not what this process runs
_WEB = """
from celery import current_app
from django.test import Client
from marketplace.server.routing import CHECK_PARTIAL

sent = []
current_app.tasks[CHECK_PARTIAL].delay = sent.append
client = Client(HTTP_AUTHORIZATION="Bearer " + os.environ["KEY"])
out = {"status": []}
for name in ("cut", "plain", "good", "good"):
    with open(os.path.join(os.environ["BODIES"], name), "rb") as f:
        body = f.read()
    response = client.put(
        "/api/v1/agent/zone/partial", data=body, content_type="application/octet-stream"
    )
    out["status"].append([response.status_code, response.json()])
out["sent"] = sent
"""


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_web_process_takes_a_partial_without_torch(tmp_path, own_media, make_agent,
                                                     submit) -> None:  # fmt: skip
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the web process reads the test database over PostgreSQL")
    zr = zone_round(make_agent, submit)
    data = zr.partial()
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    (bodies / "cut").write_bytes(data[:-4])  # a transfer cut short
    (bodies / "plain").write_bytes(zr.members[0].payload)  # an update, not a partial
    (bodies / "good").write_bytes(data)
    out = run_web(_WEB, tmp_path, KEY=zr.aggregator.key, BODIES=str(bodies))
    assert out["heavy"] == [], out["first"][0]
    (cut, why_cut), (plain, why_plain), (good, answer), (again, _) = out["status"]
    # what the header alone shows is refused at once, the problem named
    assert cut == 422 and why_cut["reason"] == "corrupt", why_cut
    assert "not a safetensors file" in why_cut["detail"]
    assert plain == 422 and why_plain["reason"] == "metadata", why_plain
    assert "not a zone partial" in why_plain["detail"]
    # received, and the same bytes again received (idempotent): one check sent
    assert (good, again) == (202, 202), out["status"]
    assert answer == {"accepted": True, "checked": False, "members": 2}
    received = ReceivedPartial.objects.get()
    assert out["sent"] == [received.pk]
    task_ids = [m.task["id"] for m in zr.members]
    assert {t.status for t in Task.objects.filter(pk__in=task_ids)} == {TaskStatus.LEASED}
    # what the worker does with the message: decoded, stored, one result per member
    check_received_partial(received.pk)
    stored = ZonePartial.objects.get()
    assert stored.update_hash == received.update_hash
    assert sorted(str(r.task_id) for r in TaskResult.objects.filter(partial=stored)) == sorted(
        task_ids
    )
    assert not ReceivedPartial.objects.exists()
    # a retry after the check: the same bytes are the accepted ones
    assert put_partial(zr.aggregator, data).status_code == 200
