"""examples/custom-vgg/ and examples/custom-unet/: a buyer's own architectures, exported
with their losses (model.arch: exported), submitted with the SDK (which uploads the program
the spec names beside it) and trained by real contributor agents (desktop/, sandboxed task
processes) against a live server, in small settings: two short rounds on two shards."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from marketplace.client import Client, spec_files
from marketplace.jobs.models import Job
from tests.live_agents import live_agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_media")]


def example_module(name: str) -> ModuleType:
    path = EXAMPLES / name / "model.py"
    spec = importlib.util.spec_from_file_location(f"example_{name.replace('-', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_job(name: str, folder: Path) -> Path:
    """The example's job.yaml beside its exported program, cut to two short rounds."""
    folder.mkdir(parents=True)
    module = example_module(name)
    module.export(folder / "vgg.pt2") if name == "custom-vgg" else module.export(folder)
    spec = yaml.safe_load((EXAMPLES / name / "job.yaml").read_text())
    spec["local"] = {"steps": 25, "batch_size": 32}
    spec["rounds"] = {"max_rounds": 2}
    spec["sharding"]["num_shards"] = 2
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def train_on_agents(url: str, provider_key: str, job: Job, tmp: Path, monkeypatch) -> Job:
    agents = [live_agent(tmp, f"agent-{i}", url, provider_key, monkeypatch) for i in range(2)]
    for agent in agents:
        agent.start()
    try:
        end = time.monotonic() + 300  # guards against hanging only
        while Job.objects.get(pk=job.pk).status not in ("completed", "failed") and (
            time.monotonic() < end
        ):
            time.sleep(0.2)
    finally:
        for agent in agents:
            agent.stop()
    job.refresh_from_db()
    return job


def test_custom_vgg_trains_on_real_agents(live_server, make_user, tmp_path, monkeypatch) -> None:
    spec = small_job("custom-vgg", tmp_path / "files")
    assert set(spec_files(spec)) == {"model_program"}  # the program goes up with the spec
    _, buyer_key = make_user("buyer")
    _, provider_key = make_user("provider")
    with Client(live_server.url, buyer_key) as client:
        submitted = client.submit(spec, budget="20", tier="platform")
    job = Job.objects.get(pk=submitted["id"])
    job = train_on_agents(live_server.url, provider_key, job, tmp_path, monkeypatch)
    assert job.status == "completed" and job.rounds_done == 2, job.error
    accuracy = [r.metrics["accuracy"] for r in job.rounds.order_by("number")]
    assert accuracy[-1] > 0.3  # ten classes: far above a guess after two rounds


def test_custom_unet_trains_on_real_agents(live_server, make_user, tmp_path, monkeypatch) -> None:
    spec = small_job("custom-unet", tmp_path / "files")
    assert set(spec_files(spec)) == {"dataset", "model_program"}
    _, buyer_key = make_user("buyer")
    _, provider_key = make_user("provider")
    with Client(live_server.url, buyer_key) as client:
        submitted = client.submit(spec, budget="20", tier="platform")
    job = Job.objects.get(pk=submitted["id"])
    assert job.input_shape == [] or job.input_shape == [1, 16, 16]
    job = train_on_agents(live_server.url, provider_key, job, tmp_path, monkeypatch)
    assert job.status == "completed" and job.rounds_done == 2, job.error
    losses = [r.metrics["loss"] for r in job.rounds.order_by("number")]
    assert losses[-1] < losses[0]  # the per-pixel loss falls
