"""Redundancy catches a cheating node; statistics catch updates pointing the wrong way."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import Precision, Task, TaskResult
from marketplace.rounds.verification import replicas_agree
from tests.marketplace.agents import Agent
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from trainer.compression import CodecConfig, encode_update
from trainer.replicas import PRECISIONS
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)

# one shard, so the second node's claim is the first task's replica; int8 as replicas travel
REPLICATED_SPEC = SMALL_SPEC | {
    "sharding": {"method": "random", "num_shards": 1},
    "compression": {"codec": "int8"},
    "rounds": {"max_rounds": 1},
}


def _train(agent: Agent, task: dict[str, Any], precision: str) -> dict[str, torch.Tensor]:
    """The task runner's training in a chosen precision."""
    result = agent.local_result(task, precision)
    assert result.precision == precision
    return result.delta


def _upload(
    agent: Agent, task: dict[str, Any], delta: dict[str, torch.Tensor], claim: str | None
) -> Any:
    """Encoded with the task's codec; the claimed precision in the metadata, as
    desktop/task_runner.py writes it (None: an older agent that sends no claim)."""
    metadata = {"task_id": task["id"]} | ({"precision": claim} if claim else {})
    payload = encode_update(delta, CodecConfig(task["codec"]), metadata=metadata)
    return agent.upload(task["id"], payload, {"steps": task["steps"], "compute_s": 1.0})


def test_honest_replicas_in_different_precisions_verify_each_other(make_agent, submit) -> None:
    cpu, gpu = make_agent(), make_agent()
    submit(tier="volunteer", spec=REPLICATED_SPEC)
    first = cpu.claim()  # untrusted: a replica is made for another node
    replica = gpu.claim()
    assert replica["seed"] == first["seed"] and first["codec"] == replica["codec"] == "int8"

    assert _upload(cpu, first, _train(cpu, first, "fp32"), claim=None).status_code == 202
    assert _upload(gpu, replica, _train(gpu, replica, "bf16"), claim="bf16").status_code == 202

    results = list(TaskResult.objects.order_by("task__replica"))
    assert [r.precision for r in results] == ["fp32", "bf16"]  # no claim: fp32
    assert all(r.verified is True and r.accepted and not r.rejection for r in results)
    assert not Task.objects.filter(replica=2).exists(), "no dispute, so no third replica"
    a, b = (decode_state(files.get(r.update_file))[0] for r in results)
    assert any(not torch.equal(a[k], b[k]) for k in a), "the replicas ran different numerics"


def test_a_cheat_claiming_another_precision_is_outvoted(make_agent, submit) -> None:
    honest, cheater, verifier = make_agent(), make_agent(), make_agent(kind="platform")
    submit(tier="volunteer", spec=REPLICATED_SPEC)
    first = honest.claim()
    replica = cheater.claim()
    assert _upload(honest, first, _train(honest, first, "fp32"), "fp32").status_code == 202
    # the cheater poisons real work (doubles it) and claims fp16, whose tolerance is loosest
    work = _train(cheater, replica, "bf16")
    doubled = {k: 2 * v for k, v in work.items()}
    assert _upload(cheater, replica, doubled, "fp16").status_code == 202
    third = verifier.claim()  # the dispute brings in a third replica, platform nodes first
    assert third is not None and third["seed"] == first["seed"]
    assert _upload(verifier, third, _train(verifier, third, "bf16"), "bf16").status_code == 202

    cheat = TaskResult.objects.get(node_id=cheater.node_id)
    assert cheat.precision == "fp16" and cheat.verified is False and not cheat.accepted
    assert "relative L2" in cheat.rejection and not cheat.credited
    others = TaskResult.objects.exclude(pk=cheat.pk)
    assert sorted(r.precision for r in others) == ["bf16", "fp32"]
    assert all(r.verified is True and r.accepted for r in others)
    assert Node.objects.get(pk=cheater.node_id).verified_bad == 1


def test_an_unknown_precision_claim_is_rejected(make_agent, submit) -> None:
    agent = make_agent()
    submit(tier="volunteer", spec=REPLICATED_SPEC)
    task = agent.claim()
    delta = _train(agent, task, "fp32")
    # received, then refused by the worker's check: the lease ends with the reason on the task
    assert _upload(agent, task, delta, "fp8").status_code == 202
    refused = Task.objects.get(pk=task["id"])
    assert refused.node_id is None and refused.last_error.startswith("upload refused (metadata)")
    assert "precision" in refused.last_error and not TaskResult.objects.exists()


def test_cheating_node_is_caught_by_redundancy_and_earns_nothing(make_agent, submit) -> None:
    honest = [make_agent() for _ in range(3)]
    cheater = make_agent()
    verifier = make_agent(kind="platform")
    agents = [cheater, *honest, verifier]  # the cheater claims first
    job = submit(tier="volunteer", spec=SMALL_SPEC | {"rounds": {"max_rounds": 1}})

    run_until_idle(agents, cheaters=[cheater])

    assert Job.objects.get(pk=job["id"]).status == "completed"
    cheats = TaskResult.objects.filter(node_id=cheater.node_id)
    assert cheats.exists()
    assert all(r.verified is False and not r.credited and not r.aggregated for r in cheats)
    # each disputed unit got a third replica, and the honest majority was credited
    for result in cheats:
        unit = TaskResult.objects.filter(
            task__round=result.task.round, task__shard=result.task.shard
        ).exclude(pk=result.pk)
        assert unit.count() == 2 and all(r.verified and r.credited for r in unit)
    node = Node.objects.get(pk=cheater.node_id)
    assert node.verified_bad == cheats.count() and node.reliability < 0.5
    assert cheater.client.get("/api/v1/agent/me").json()["earnings"]["total"] == "0.000000"
    assert all(r.credited for r in TaskResult.objects.exclude(node_id=cheater.node_id)), (
        "honest nodes are paid"
    )


def test_unreliable_node_gets_no_more_work(make_agent, submit) -> None:
    agent = make_agent()
    Node.objects.filter(pk=agent.node_id).update(reliability=0.1)
    submit(tier="volunteer")
    assert agent.claim() is None


def test_trusted_volunteer_is_replicated_only_sometimes(make_agent, submit, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"REPLICATION_SHARE": 0.0}
    agent = make_agent()
    Node.objects.filter(pk=agent.node_id).update(verified_ok=10, reliability=0.9)
    submit(tier="volunteer")
    agent.claim()
    assert Task.objects.filter(replica__gt=0).count() == 0
    newbie = make_agent()
    newbie.claim()
    assert Task.objects.filter(replica__gt=0).count() == 1


def test_platform_node_takes_replicas_first(make_agent, submit) -> None:
    volunteer, platform = make_agent(), make_agent(kind="platform")
    submit(tier="hybrid")
    volunteer.claim()  # untrusted: its task gets a replica
    task = platform.claim()
    assert Task.objects.get(pk=task["id"]).replica == 1


def test_agreement_tolerance_setting_binds_replicas_claiming_one_precision(settings) -> None:
    a = {"w": torch.ones(100)}
    near = {"w": torch.ones(100) * 1.05}  # relative L2 0.048: honest across devices
    fp32, bf16 = TaskResult(precision="fp32"), TaskResult(precision="bf16")
    assert replicas_agree(fp32, fp32, a, near).agreed  # default: the cross-device tolerance
    assert not replicas_agree(fp32, fp32, a, {"w": torch.zeros(100)}).agreed
    assert not replicas_agree(fp32, bf16, a, {"w": -a["w"]}).agreed
    settings.GPUFLEX = settings.GPUFLEX | {"AGREEMENT_TOLERANCE": 1e-3}  # one kind of device
    assert replicas_agree(fp32, fp32, a, {"w": a["w"] + 1e-6}).agreed
    assert not replicas_agree(fp32, fp32, a, near).agreed
    assert replicas_agree(fp32, bf16, a, near).agreed  # differing claims: never that tight


def test_stored_precisions_are_the_trainers() -> None:
    assert tuple(Precision.values) == PRECISIONS


def test_unreconciled_dispute_is_not_aggregated_at_the_deadline(make_agent, submit) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from marketplace.rounds.maintenance import tick
    from marketplace.rounds.models import Round

    honest, cheater = make_agent(), make_agent()
    spec = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 1}}
    submit(tier="volunteer", spec=spec)
    first = honest.claim()  # untrusted: a replica is made for another node
    replica = cheater.claim()
    assert replica["id"] != first["id"] and replica["seed"] == first["seed"]
    assert honest.work(first).status_code == 202
    assert cheater.work(replica, cheat=True).status_code == 202
    assert Task.objects.filter(replica=2, status="pending").exists()  # a third is wanted
    assert all(r.verified is None for r in TaskResult.objects.all())

    Round.objects.update(deadline=timezone.now() - timedelta(seconds=1))
    assert tick()["closed"] == 0  # neither side of the dispute may be used
    rnd = Round.objects.get()
    assert rnd.status == "open" and rnd.deadline > timezone.now()
    assert not TaskResult.objects.filter(aggregated=True).exists()
