"""The scheduler gives a task only to nodes whose training runtime can run it (runtime packs,
docs/runtime-packs.md): bf16/fp16 precision needs a GPU runtime, and `runtime.min_torch`
an at-least-that torch. One rule (planning.may_work_on) for the live claim and the bulk
planner, and why_no_node says which runtime is missing."""

from __future__ import annotations

from typing import Any

import pytest

from marketplace.jobs.market import why_no_node
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.planning import torch_at_least
from tests.marketplace.helpers import SMALL_SPEC, assert_claim_and_planner_agree

GPU = {"gpu_vendor": "nvidia", "gpu_model": "RTX 4090", "memory_gb": 24, "accelerator": "cuda"}
CPU_RUNTIME = {"plan": "cpu", "torch": "2.13.0+cpu", "cuda": "", "source": "pack"}
CUDA_NEW = {"plan": "cuda12", "torch": "2.13.0", "cuda": "12.8", "source": "pack"}
CUDA_OLD = {"plan": "cuda12", "torch": "2.12.1", "cuda": "12.6", "source": "pack"}


def _spec(precision: str = "fp32", min_torch: str | None = None) -> dict[str, Any]:
    spec = SMALL_SPEC | {"local": {"steps": 8, "batch_size": 32, "precision": precision},
                         "sharding": {"method": "stratified", "num_shards": 8}}  # fmt: skip
    if min_torch:
        spec["runtime"] = {"min_torch": min_torch}
    return spec


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("precision", "min_torch", "allowed"),
    [
        ("bf16", None, {"cuda_new", "cuda_old"}),
        ("fp16", None, {"cuda_new", "cuda_old"}),
        ("fp32", "2.13", {"cpu_runtime", "cuda_new"}),
        ("bf16", "2.13.0", {"cuda_new"}),
        ("fp32", None, {"cpu_runtime", "cuda_new", "cuda_old"}),
    ],
)
def test_the_claim_and_the_planner_refuse_what_the_runtime_cannot_run(
    make_agent, submit, precision: str, min_torch: str | None, allowed: set[str]
) -> None:
    # three GPU machines: one runs the cpu pack (its driver too old for cuda12, say)
    nodes = {
        "cpu_runtime": make_agent(kind="platform", hardware=GPU, runtime=CPU_RUNTIME),
        "cuda_new": make_agent(kind="platform", hardware=GPU, runtime=CUDA_NEW),
        "cuda_old": make_agent(kind="platform", hardware=GPU, runtime=CUDA_OLD),
    }
    job = submit(_spec(precision, min_torch), tier="platform")
    assert_claim_and_planner_agree(nodes, job, allowed)


@pytest.mark.django_db
def test_why_no_node_names_the_runtime_and_a_heartbeat_brings_a_new_one(make_agent, submit) -> None:
    node = make_agent(kind="platform", hardware=GPU, runtime=CPU_RUNTIME)
    job = submit(_spec("bf16", "2.13"), tier="platform")
    assert node.claim() is None
    why = why_no_node(Job.objects.get(pk=job["id"]))
    assert "cannot run it with their training runtime" in why
    assert "a GPU runtime (cuda12, cuda13, rocm or mps) for its bf16/fp16 precision" in why
    assert "torch 2.13 or newer" in why and "gpuflex-node runtime fetch" in why
    # the owner fetched the cuda12 pack: the next heartbeat says so, and the task is its
    assert node.heartbeat("idle", runtime=CUDA_NEW).status_code == 200
    assert Node.objects.get(pk=node.node_id).runtime == CUDA_NEW
    assert node.claim() is not None


@pytest.mark.django_db
def test_an_older_agent_is_judged_by_its_hardware_report(make_agent, submit) -> None:
    """No `runtime` (an agent from before packs): its accelerator and probed torch stand in."""
    old_gpu = make_agent(kind="platform", hardware=GPU | {"torch_version": "2.12.0"})
    cpu_box = {"gpu_model": "", "memory_gb": 64, "accelerator": "cpu", "torch_version": "2.13.0"}
    cpu = make_agent(kind="platform", hardware=cpu_box)
    bf16 = submit(_spec("bf16"), tier="platform")["id"]
    new_torch = submit(_spec("fp32", "2.13"), tier="platform")["id"]
    assert _jobs_claimed(cpu) == {new_torch}
    assert _jobs_claimed(old_gpu) == {bf16}


def _jobs_claimed(agent: Any) -> set[str]:
    jobs = set()
    while (task := agent.claim()) is not None:
        jobs.add(task["job_id"])
    return jobs


@pytest.mark.django_db
def test_a_bad_runtime_is_refused_and_nothing_is_stored(provider, make_agent) -> None:
    from tests.marketplace.helpers import HARDWARE

    body = {"name": "n", "hardware": HARDWARE, "price_per_gpu_hour": "0.4"}
    for runtime, field in [({"plan": "opencl", "torch": "2.13.0"}, "plan"),
                           ({"plan": "cpu", "torch": "2.13; rm -rf"}, "torch"),
                           ({"plan": "cpu"}, "torch")]:  # fmt: skip
        response = provider.post("/api/v1/nodes/", body | {"runtime": runtime}, format="json")
        assert response.status_code == 400 and field in str(response.json()), response.content
    assert not Node.objects.exists()
    agent = make_agent()
    bad = agent.heartbeat("idle", runtime={"plan": "tpu", "torch": "2"})
    assert bad.status_code == 400
    assert Node.objects.get(pk=agent.node_id).runtime == {}


def test_torch_versions_compare_by_release() -> None:
    assert torch_at_least("2.13.0+cu128", "2.13") and torch_at_least("2.14.0", "2.13.1")
    assert not torch_at_least("2.12.9", "2.13") and not torch_at_least("", "2.13")
    assert torch_at_least("2.13.0", "2.13.0") and not torch_at_least("nightly", "2.0")
