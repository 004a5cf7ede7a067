"""examples/stdlib-lm.yaml and examples/lora-finetune.yaml through the marketplace (small
settings): submitted with the SDK, which uploads the files each spec names beside it
(`gpuflex examples write` makes them), and trained to completion.

stdlib-lm runs on two real contributor agents (desktop/, sandboxed task processes) against a
live server. lora-finetune runs on the in-process test agents (tests/marketplace/agents.py):
a sandboxed task process imports only what the node's own install has, and transformers and
peft are an optional extra that a test machine may lack."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from marketplace.client import Client, spec_files
from marketplace.jobs.models import Job
from tests.live_agents import live_agent
from tests.marketplace.test_job_flow import run_until_idle
from trainer.example_files import write_examples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_media")]


def small_example(spec_file: str, folder: Path, corpus_bytes: int = 40_000) -> Path:
    """The example spec beside its written files, cut to two short rounds on two shards."""
    write_examples(folder, corpus_bytes)
    spec = yaml.safe_load((EXAMPLES / spec_file).read_text())
    spec["local"] = {"steps": 3, "batch_size": 8}
    spec["dataset"]["seq_len"] = 32
    spec["rounds"] = {"max_rounds": 2}
    spec["sharding"]["num_shards"] = 2
    path = folder / spec_file
    path.write_text(yaml.safe_dump(spec))
    return path


def submit(url: str, key: str, spec: Path) -> Job:
    with Client(url, key) as client:
        job = client.submit(spec, budget="20", tier="platform")
    return Job.objects.get(pk=job["id"])


def test_stdlib_lm_trains_on_real_agents(live_server, make_user, tmp_path, monkeypatch) -> None:
    spec = small_example("stdlib-lm.yaml", tmp_path / "files")
    assert set(spec_files(spec)) == {"dataset"}  # the corpus goes up with the spec
    _, buyer_key = make_user("buyer")
    _, provider_key = make_user("provider")
    job = submit(live_server.url, buyer_key, spec)
    assert job.task_kind == "language_model" and job.num_classes == 256
    assert job.dataset_file.endswith("/dataset.jsonl")
    agents = [live_agent(tmp_path, f"agent-{i}", live_server.url, provider_key, monkeypatch)
              for i in range(2)]  # fmt: skip
    for agent in agents:
        agent.start()
    try:
        end = time.monotonic() + 300  # guards against hanging only
        while Job.objects.get(pk=job.pk).status != "completed" and time.monotonic() < end:
            time.sleep(0.2)
    finally:
        for agent in agents:
            agent.stop()
    job.refresh_from_db()
    assert job.status == "completed" and job.rounds_done == 2, job.error
    losses = [r.metrics["loss"] for r in job.rounds.order_by("number")]
    assert all(0 < loss < 5.55 for loss in losses)  # below a uniform guess over 256 bytes


def test_lora_finetune_trains_through_the_marketplace(
    live_server, make_user, make_agent, tmp_path
) -> None:
    pytest.importorskip("peft")
    spec = small_example("lora-finetune.yaml", tmp_path / "files")
    assert set(spec_files(spec)) == {"dataset", "model_config", "model_checkpoint"}
    _, buyer_key = make_user("buyer")
    job = submit(live_server.url, buyer_key, spec)
    assert job.spec["model"]["config"]["model_type"] == "gpt2"  # inlined for every node
    assert job.spec["model"]["checkpoint"] == "tiny-gpt2.safetensors"
    assert run_until_idle([make_agent(kind="platform") for _ in range(2)]) == 4
    job.refresh_from_db()
    assert job.status == "completed" and job.rounds_done == 2, job.error
