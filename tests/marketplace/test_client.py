"""The SDK against the real app (in-process WSGI), and its independence from Django."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from django.core.wsgi import get_wsgi_application

from marketplace.client import Client, GPUFlexError
from tests.marketplace.helpers import SMALL_SPEC
from trainer.hashing import state_hash
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sdk(make_user):
    _, key = make_user("buyer")
    transport = httpx.WSGITransport(app=get_wsgi_application())
    with Client("http://testserver", key, transport=transport) as client:
        yield client


def test_sdk_imports_no_django() -> None:
    code = "import sys, marketplace.client, marketplace.cli; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = json.loads(out.stdout.replace("'", '"'))
    assert not [m for m in modules if m.split(".")[0] in {"django", "rest_framework", "torch"}]


def test_submit_follow_download(sdk, make_agent, tmp_path) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(SMALL_SPEC | {"rounds": {"max_rounds": 1}}))
    job = sdk.submit(spec_file, budget="10", tier="platform", max_price_per_gpu_hour="0.50")
    assert job["status"] == "running"
    for agent in agents:
        assert agent.work(agent.claim()).status_code == 202
    states = list(sdk.follow(job["id"], interval=0))
    assert states[-1]["status"] == "completed"
    assert [j["id"] for j in sdk.jobs()] == [job["id"]]
    assert len(sdk.rounds(job["id"])) == 1
    model, record = sdk.download(job["id"], tmp_path / "out")
    state, _ = decode_state(model.read_bytes())
    assert state_hash(state) == states[-1]["model_hash"]
    assert json.loads(record.read_text())["records"][0]["round"] == 1


def test_sdk_raises_the_servers_error(sdk) -> None:
    with pytest.raises(GPUFlexError) as info:
        sdk.submit(SMALL_SPEC | {"model": {"arch": "gpt"}}, budget="10")
    assert info.value.status == 400 and info.value.code == "invalid_spec"
    assert "model.arch" in info.value.detail
    with pytest.raises(GPUFlexError) as missing:
        sdk.job("00000000-0000-0000-0000-000000000000")
    assert missing.value.status == 404


def test_sdk_uploads_a_dataset(sdk, tmp_path) -> None:
    data = tmp_path / "d.csv"
    data.write_text("a,b,label\n" + "\n".join(f"{i},{i % 3},{i % 2}" for i in range(30)))
    spec = SMALL_SPEC | {"dataset": {"kind": "csv", "path": "d.csv"}}
    job = sdk.submit(spec, dataset=data, budget="10")
    assert job["spec"]["dataset"]["path"] == "d.csv"
