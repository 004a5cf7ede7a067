"""A web process takes job submissions without importing torch (issue 36): what needs torch
(reading the dataset into tensors, measuring the model) runs in the worker that prepares the
job (jobs/worker_checks.py); the request keeps the checks that need none, so bad input
still gets its 4xx at once."""

from __future__ import annotations

import json

import pytest

from marketplace.jobs.models import Job
from marketplace.jobs.preparation import prepare_job
from marketplace.rounds.models import Round
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.web_process import run_web

# the web process: the WSGI app's settings, the Django test client through every layer (auth,
# throttles, the view, the service); the broker replaced by a list, as the worker is not
# what this process runs
_WEB = """
from celery import current_app
from django.test import Client
from marketplace.server.routing import PREPARE_JOB

sent = []
current_app.tasks[PREPARE_JOB].delay = sent.append
client = Client(HTTP_AUTHORIZATION="Bearer " + os.environ["KEY"])
out = {"status": []}
for body in json.loads(os.environ["BODIES"]):
    if "csv" in body:
        path = os.path.join(os.environ["GPUFLEX_DATA_DIR"], "data.csv")
        with open(path, "w") as f:
            f.write(body.pop("csv"))
        with open(path, "rb") as f:
            response = client.post("/api/v1/jobs/", {**body, "dataset": f})
    else:
        response = client.post("/api/v1/jobs/", json.dumps(body), content_type="application/json")
    out["status"].append([response.status_code, response.json()])
out["sent"] = sent
"""


def _csv(rows: int = 40, bad: str = "") -> str:
    lines = ["a,b,label"] + [f"{i * 0.1:.2f},{(i % 7) * 0.3:.2f},{i % 2}" for i in range(rows)]
    if bad:
        lines.append(bad)
    return "\n".join(lines)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_web_process_takes_submissions_without_torch(tmp_path, make_user, own_media) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the web process reads the test database over PostgreSQL")
    buyer, key = make_user("buyer")
    price = {"max_price_per_gpu_hour": "1.00", "budget": "10"}
    csv_spec = SMALL_SPEC | {
        "dataset": {"kind": "csv", "path": "data.csv"},
        "sharding": {"method": "stratified", "num_shards": 2},
    }
    bodies = [
        {"spec": SMALL_SPEC} | price,  # the built-in digits
        {"spec": json.dumps(csv_spec), "csv": _csv()} | price,  # an uploaded CSV
        {"spec": json.dumps(csv_spec), "csv": _csv(bad="1,x,0")} | price,  # refused at once
    ]
    out = run_web(_WEB, tmp_path, KEY=key, BODIES=json.dumps(bodies))
    assert out["heavy"] == [], out["first"][0]
    (digits, _), (csv, _), (bad, refusal) = out["status"]
    assert (digits, csv, bad) == (201, 201, 400), out["status"]
    assert refusal["error"] == "invalid_dataset"
    assert "column 'b', row 41: 'x' is not a number" in refusal["detail"]
    assert "data.csv" in refusal["detail"]
    # accepted without shards; the worker reads, measures, cuts and opens round 1
    jobs = Job.objects.filter(buyer=buyer)
    assert sorted(str(j.pk) for j in jobs) == sorted(out["sent"])
    assert all(not j.footprint and not j.shards.exists() for j in jobs)
    for job in jobs:
        assert prepare_job(job.pk) is not None
        job.refresh_from_db()
        assert job.footprint["parameters"] > 0 and job.shards.exists()
    shapes = sorted(tuple(j.input_shape) for j in jobs)
    assert shapes == [(2,), (64,)]
    assert Round.objects.filter(job__in=jobs, number=1).count() == 2
