"""Exported programs through the marketplace's submission: the request's gate refuses a
hostile program with a 400 naming the problem and stores nothing; a good one is accepted,
measured by the worker on the meta device and gets its round 1."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from django.core.files.uploadedfile import SimpleUploadedFile
from torch import nn
from torch.nn import functional as F

from marketplace.jobs import files
from marketplace.jobs.model_files import program_name
from marketplace.jobs.models import Job
from marketplace.rounds.models import Round
from trainer.exported.archive import read_archive
from trainer.exported.export import export_program
from trainer.exported.loader import load_program
from trainer.updates import decode_state

SPEC = {"name": "exported-digits", "dataset": {"kind": "digits"},
        "model": {"arch": "exported", "program": "net.pt2"},
        "local": {"steps": 2, "batch_size": 16}, "rounds": {"max_rounds": 1},
        "sharding": {"method": "stratified", "num_shards": 2}}  # fmt: skip
XY = (torch.zeros(4, 64), torch.zeros(4, dtype=torch.long))


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return export_program(net, F.cross_entropy, XY, tmp_path_factory.mktemp("p") / "net.pt2")


def _post(buyer, data: bytes | None, spec: dict = SPEC):
    body = {"spec": json.dumps(spec), "max_price_per_gpu_hour": "1.00", "budget": "10"}
    if data is not None:
        body["model_program"] = SimpleUploadedFile("net.pt2", data)
    return buyer.post("/api/v1/jobs/", body, format="multipart")


def _with_target(path: Path, target: str) -> bytes:
    out = path.with_name("hostile.pt2")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("models/model.json"):
                doc = json.loads(data)
                doc["graph_module"]["graph"]["nodes"][0]["target"] = target
                data = json.dumps(doc).encode()
            dst.writestr(info, data)
    return out.read_bytes()


@pytest.mark.django_db(transaction=True)
def test_hostile_programs_are_refused_and_nothing_stored(buyer, program: Path) -> None:
    cases = {
        "aten::from_file": _with_target(program, "torch.ops.aten.from_file.default"),
        "evil::run": _with_target(program, "torch.ops.evil.run.default"),
        "truncated": program.read_bytes()[:300],
    }
    for expected, data in cases.items():
        response = _post(buyer, data)
        assert response.status_code == 400, (expected, response.content)
        detail = response.json()["detail"]
        assert "model.program" in detail, detail
        if expected != "truncated":
            assert expected in detail, detail
    missing = _post(buyer, None)
    assert missing.status_code == 400 and "model_program" in missing.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_program_is_accepted_measured_and_prepared(
    buyer, program: Path, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(buyer, program.read_bytes())
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.spec["model"]["program"] == "net.pt2"  # the buyer's name, not a path of ours
    assert files.get(program_name(job.pk)) == program.read_bytes()
    job.refresh_from_db()
    assert job.error == "" and Round.objects.filter(job=job).count() == 1, job.error
    assert job.footprint["parameters"] == 64 * 32 + 32 + 32 * 10 + 10
    assert job.footprint["activation_bytes"] > 0


@pytest.mark.django_db(transaction=True)
def test_an_exported_job_trains_its_rounds(make_agent, buyer, program: Path) -> None:
    from tests.marketplace.test_job_flow import run_until_idle

    spec = SPEC | {"rounds": {"max_rounds": 2}}
    response = _post(buyer, program.read_bytes(), spec)
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    agents = [make_agent(kind="platform") for _ in range(2)]
    first = agents[0].claim()
    assert first["program"] is True and first["model_source"]["kind"] == "full"
    assert agents[0].work(first).status_code == 202
    run_until_idle(agents)
    job.refresh_from_db()
    assert job.status == "completed" and job.rounds_done == 2, job.error
    final = buyer.get(f"/api/v1/jobs/{job.pk}/rounds/").json()["results"]
    assert final and all(r["metrics"].get("accuracy") is not None for r in final)
    # the trained program comes back with the final weights in it; the weights alone too
    url = f"/api/v1/jobs/{job.pk}/model"
    weights = decode_state(buyer.get(url, {"format": "safetensors"}).content)[0]
    pt2 = buyer.get(url, {"format": "pt2"})
    assert pt2.status_code == 200 and pt2["Content-Disposition"].endswith('.pt2"')
    trained = load_program(read_archive(pt2.content, 2**26))
    for name, tensor in trained.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    onnx = buyer.get(url, {"format": "onnx"})
    assert onnx.status_code == 400 and "pt2" in onnx.json()["detail"]
    scoring = {"name": "score", "kind": "evaluate", "source": {"job": str(job.pk)}}
    refused = buyer.post("/api/v1/jobs/", {"spec": json.dumps(scoring), "budget": "1",
                                           "max_price_per_gpu_hour": "1.00"})  # fmt: skip
    assert refused.status_code == 400 and "source.job" in refused.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_network_aware_rounds_are_refused_for_a_program(buyer, program: Path) -> None:
    response = _post(buyer, program.read_bytes(), SPEC | {"adaptation": {"enabled": True}})
    assert response.status_code == 400 and "adaptation.enabled" in response.json()["detail"]
    assert not Job.objects.exists()


class _Blowup(nn.Module):
    """Small weights, and 512 MiB of activations per sample: past a budget-10 job's cap."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.new_zeros(x.shape[0], 2**27) + 1.0
        return self.fc(x) + wide.mean(dim=1, keepdim=True)


@pytest.mark.django_db(transaction=True)
def test_activations_past_the_cap_fail_the_job_in_the_worker(
    buyer, tmp_path: Path, django_capture_on_commit_callbacks
) -> None:
    path = export_program(_Blowup(), F.cross_entropy, XY, tmp_path / "blowup.pt2")
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(buyer, path.read_bytes())
    assert response.status_code == 201, response.content  # the gate passes it: no torch there
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == "failed", job.error
    assert "one sample's largest tensor takes 512.0 MiB" in job.error, job.error
    assert not Round.objects.filter(job=job).exists()
