"""Buyer-provided models through the marketplace: an HF config.json and safetensors checkpoint,
LoRA jobs whose updates are the adapters alone, and hardware requirements the scheduler keeps."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import safetensors.torch
from django.core.files.uploadedfile import SimpleUploadedFile

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import Task, TaskResult, TaskStatus
from marketplace.rounds.scheduling import lease_batch
from tests.marketplace.helpers import SMALL_SPEC, assert_claim_and_planner_agree
from tests.marketplace.test_job_flow import run_until_idle
from trainer.lora import is_adapter_key
from trainer.models import build_model
from trainer.spec import ModelSpec
from trainer.updates import decode_state, encode_state

pytest.importorskip("peft")

SEQ = 8
LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 64, "max_position_embeddings": 32}  # fmt: skip
LORA_SPEC = {
    "name": "lora-seq-cls",
    "seed": 0,
    "dataset": {"kind": "npz", "path": "tokens.npz", "test_fraction": 0.25},
    "model": {"arch": "hf_seq_cls", "config": "config.json", "checkpoint": "base.safetensors",
              "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
    "optimizer": {"name": "adamw", "lr": 0.01},
    "local": {"steps": 3, "batch_size": 16},
    "rounds": {"max_rounds": 2},
    "sharding": {"method": "stratified", "num_shards": 2},
}  # fmt: skip


def _tokens_npz() -> bytes:
    """Token ids (as an npz of integers) labelled by whether the first token is in the top
    half of the vocabulary: something a sequence classifier can learn."""
    rng = np.random.default_rng(0)
    x = rng.integers(1, 64, size=(80, SEQ))
    buf = io.BytesIO()
    np.savez(buf, x=x, y=(x[:, 0] >= 32).astype(np.int64))
    return buf.getvalue()


def _base_checkpoint() -> dict:
    """The base model's weights as `save_pretrained` writes them (a seed other than the job's,
    so the job's round 1 can only be this checkpoint)."""
    model = build_model(ModelSpec(arch="hf_seq_cls", config=LLAMA), (SEQ,), 2, seed=7)
    return {k: v.detach().clone() for k, v in model.hf.state_dict().items()}


def _post(buyer, spec: dict, *, config: bytes | None, checkpoint: bytes | None, **fields):
    body = {"spec": json.dumps(spec), "max_price_per_gpu_hour": "1.00", "budget": "10",
            "dataset": SimpleUploadedFile("tokens.npz", _tokens_npz())} | fields  # fmt: skip
    if config is not None:
        body["model_config"] = SimpleUploadedFile("config.json", config)
    if checkpoint is not None:
        body["model_checkpoint"] = SimpleUploadedFile("base.safetensors", checkpoint)
    return buyer.post("/api/v1/jobs/", body, format="multipart")


@pytest.mark.django_db(transaction=True)
def test_a_lora_job_from_an_uploaded_checkpoint_runs_its_rounds(make_agent, buyer) -> None:
    base = _base_checkpoint()
    response = _post(buyer, LORA_SPEC, config=json.dumps(LLAMA).encode(),
                     checkpoint=safetensors.torch.save(base), tier="platform")  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.spec["model"]["config"]["model_type"] == "llama"  # inlined for every node
    assert job.spec["model"]["checkpoint"] == "base.safetensors"  # the buyer's name, not ours
    assert job.footprint["trainable"] < job.footprint["parameters"] / 5

    agents = [make_agent(kind="platform") for _ in range(2)]
    first = agents[0].claim()
    assert first is not None and first["model_source"]["kind"] == "full"  # not from the seed
    assert first["footprint"] == job.footprint
    assert agents[0].work(first).status_code == 202
    run_until_idle(agents)

    job.refresh_from_db()
    assert job.status == "completed" and job.rounds_done == 2
    sizes = []
    for result in TaskResult.objects.filter(task__round__job=job):
        update, _ = decode_state(files.get(result.update_file))
        assert update and all(is_adapter_key(k) for k in update), sorted(update)[:3]
        sizes.append(len(files.get(result.update_file)))
    final, _ = decode_state(files.get(job.model_file))
    prefix = "hf.base_model.model."
    for name, tensor in base.items():  # the frozen base is the buyer's checkpoint still
        key = prefix + name.replace("q_proj.weight", "q_proj.base_layer.weight").replace(
            "v_proj.weight", "v_proj.base_layer.weight"
        )
        if "score" in name:
            key = prefix + name.replace("score.", "score.original_module.")
        assert (final[key] == tensor).all(), name
    full = len(encode_state(final))
    assert max(sizes) * 5 < full  # only the adapters (and the new head) travel


def test_model_files_named_but_missing_or_unfit_are_refused(
    buyer, django_capture_on_commit_callbacks
) -> None:
    config = json.dumps(LLAMA).encode()
    checkpoint = safetensors.torch.save(_base_checkpoint())
    missing = _post(buyer, LORA_SPEC, config=None, checkpoint=checkpoint)
    assert missing.status_code == 400 and "model_config" in missing.json()["detail"]
    no_ckpt = _post(buyer, LORA_SPEC, config=config, checkpoint=None)
    assert no_ckpt.status_code == 400 and "model_checkpoint" in no_ckpt.json()["detail"]
    garbage = _post(buyer, LORA_SPEC, config=config, checkpoint=b"\x00not safetensors")
    assert garbage.status_code == 400 and "model.checkpoint" in garbage.json()["detail"]
    remote = _post(buyer, LORA_SPEC, config=json.dumps(LLAMA | {"auto_map": {}}).encode(),
                   checkpoint=checkpoint)  # fmt: skip
    assert remote.status_code == 400 and "remote code" in remote.json()["detail"]
    assert not Job.objects.exists()
    # a checkpoint that does not fit the config is found by building the model, which a
    # request never does: the worker measures it (in a child) and fails the job, saying why
    wrong = dict(_base_checkpoint())
    wrong["model.embed_tokens.weight"] = wrong["model.embed_tokens.weight"][:10]
    with django_capture_on_commit_callbacks(execute=True):
        unfit = _post(buyer, LORA_SPEC, config=config, checkpoint=safetensors.torch.save(wrong))
    assert unfit.status_code == 201, unfit.content
    job = Job.objects.get(pk=unfit.json()["id"])
    assert job.status == "failed" and "shape" in job.error and "model.checkpoint" in job.error
    assert buyer.get(f"/api/v1/jobs/{job.pk}/").json()["error"] == job.error


CPU = {"gpu_vendor": "", "gpu_model": "", "memory_gb": 64, "accelerator": "cpu"}
SMALL_GPU = {"gpu_vendor": "nvidia", "gpu_model": "RTX 3060", "memory_gb": 12}
BIG_GPU = {"gpu_vendor": "nvidia", "gpu_model": "A100", "memory_gb": 80}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("requirements", "allowed"),
    [
        ({"gpu_required": True}, {"small_gpu", "big_gpu", "slow_gpu"}),
        ({"min_vram_gb": 40}, {"big_gpu", "slow_gpu"}),
        ({"min_fp32_tflops": 50}, {"small_gpu", "big_gpu"}),
        ({"min_vram_gb": 40, "min_fp32_tflops": 50}, {"big_gpu"}),
        ({}, {"cpu", "small_gpu", "big_gpu", "slow_gpu"}),
    ],
)
def test_the_claim_and_the_bulk_planner_keep_hardware_requirements(
    make_agent, submit, requirements: dict, allowed: set[str]
) -> None:
    nodes = {
        "cpu": make_agent(kind="platform", hardware=CPU, benchmark={"fp32_tflops": 1}),
        "small_gpu": make_agent(kind="platform", hardware=SMALL_GPU,
                                benchmark={"fp32_tflops": 60}),
        "big_gpu": make_agent(kind="platform", hardware=BIG_GPU, benchmark={"fp32_tflops": 80}),
        "slow_gpu": make_agent(kind="platform", hardware=BIG_GPU, benchmark={"fp32_tflops": 5}),
    }  # fmt: skip
    spec = SMALL_SPEC | {"requirements": requirements,
                         "sharding": {"method": "stratified", "num_shards": 8}}  # fmt: skip
    job = submit(spec, tier="platform")
    assert_claim_and_planner_agree(nodes, job, allowed)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("isolation", "allowed"), [("full", {"bwrap"}), ("any", {"bwrap", "winjob", "older"})]
)
def test_a_job_that_requires_full_isolation_never_goes_to_a_limits_only_node(
    make_agent, submit, isolation: str, allowed: set[str]
) -> None:
    """`requirements.isolation: full`: a node whose sandbox only limits a task (a Windows job
    object, no bubblewrap) or that never said (an older agent) takes none of its tasks."""
    nodes = {
        "bwrap": make_agent(kind="platform", hardware=SMALL_GPU | {"isolation": "full"}),
        "winjob": make_agent(kind="platform", hardware=SMALL_GPU | {"isolation": "limits"}),
        "older": make_agent(kind="platform", hardware=SMALL_GPU),
    }
    spec = SMALL_SPEC | {"requirements": {"isolation": isolation},
                         "sharding": {"method": "stratified", "num_shards": 8}}  # fmt: skip
    job = submit(spec, tier="platform")
    claimed = {name for name, agent in nodes.items() if agent.claim() is not None}
    assert claimed == allowed  # the live claim

    Task.objects.filter(round__job=job["id"]).update(status=TaskStatus.PENDING, node=None)
    rows = Node.objects.filter(pk__in=[a.node_id for a in nodes.values()])
    assert lease_batch(list(rows)) == len(allowed)  # the bulk planner, by the same rule


def test_a_spec_names_only_the_isolation_levels_there_are() -> None:
    from trainer.spec import SpecError, parse_spec

    assert parse_spec({"name": "t", "requirements": {"isolation": "full"}}).requirements
    with pytest.raises(SpecError, match="isolation"):
        parse_spec({"name": "t", "requirements": {"isolation": "strong"}})
