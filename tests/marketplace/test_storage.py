"""Artifacts go through Django storage only: a job runs on a storage without local paths
(in-memory here, standing in for S3 via django-storages)."""

from __future__ import annotations

import pytest
from django.core.files.storage import FileSystemStorage, default_storage, storages
from django.core.files.uploadedfile import SimpleUploadedFile

from marketplace.jobs.models import Job
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def memory_storage(settings) -> None:
    settings.STORAGES = settings.STORAGES | {
        "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"}
    }


def test_job_with_uploaded_dataset_runs_on_pathless_storage(make_agent, buyer) -> None:
    assert not isinstance(storages["default"], FileSystemStorage)  # no local paths, like S3
    rows = "\n".join(f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(60))
    spec = SMALL_SPEC | {
        "dataset": {"kind": "csv", "path": "d.csv"},
        "rounds": {"max_rounds": 1},
    }
    import json

    response = buyer.post(
        "/api/v1/jobs/",
        {
            "spec": json.dumps(spec),
            "dataset": SimpleUploadedFile("d.csv", f"a,b,label\n{rows}".encode()),
            "tier": "platform",
            "max_price_per_gpu_hour": "1",
            "budget": "10",
        },
        format="multipart",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    agents = [make_agent(kind="platform") for _ in range(3)]
    for agent in agents:
        assert agent.work(agent.claim()).status_code == 202
    job = Job.objects.get(pk=job_id)
    assert job.status == "completed"
    assert default_storage.exists(job.model_file)
    assert default_storage.exists(f"jobs/{job_id}/checkpoint.safetensors")
    assert buyer.get(f"/api/v1/jobs/{job_id}/model").status_code == 200
