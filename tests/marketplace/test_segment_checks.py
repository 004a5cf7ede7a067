"""Proof-of-learning segment checks (marketplace/proofs) through the agent API, with the real
task runner (desktop.task_runner) making the updates and checkpoints, its fault injection the
cheats: an honest task passes; half the steps, a scaled update, another part of the data, a
copied or stale update fail; so do a wrong checkpoint, a missed deadline and, where proofs are
required, an upload without one."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from desktop import task_runner
from marketplace.nodes.models import Node
from marketplace.proofs.models import CheckStatus, SegmentCheck
from marketplace.proofs.services import expire_overdue, overhead
from marketplace.rounds.models import TaskResult


@pytest.fixture
def always_checked(monkeypatch):
    monkeypatch.setitem(settings.GPUFLEX, "SEGMENT_CHECK_SHARE", 1.0)


def _run_task(agent, task, folder: Path, source: bytes | None = None) -> bytes:
    """What the real agent does with a claimed task: its folder, the sandboxed runner
    (`source`: the update a copy or stale cheat is handed by its fault injection)."""
    folder.mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps(task))
    (folder / "model.safetensors").write_bytes(agent.model(task["id"]).content)
    (folder / "shard.safetensors").write_bytes(agent.shard(task["id"]).content)
    if source is not None:
        (folder / task_runner.CHEAT_SOURCE).write_bytes(source)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    return (folder / "update.safetensors").read_bytes()


def _reveal_all(agent, folder: Path, on_commit) -> list[dict]:
    """Every checkpoint asked for; the re-run the last one enqueues runs (eager Celery)."""
    asked = agent.client.get("/api/v1/agent/proofs").json()["requests"]
    with on_commit(execute=True):
        _put_all(agent, folder, asked)
    return asked


def _put_all(agent, folder: Path, asked: list[dict]) -> None:
    for request in asked:
        for step in request["steps"]:
            body = (folder / task_runner.CHECKPOINT.format(step)).read_bytes()
            response = agent.client.put(
                f"/api/v1/agent/proofs/{request['id']}/checkpoints/{step}",
                data=body, content_type="application/octet-stream",
            )  # fmt: skip
            assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    ("cheat", "passes"),
    [("", True), ("half_steps", False), ("scaled:2", False), ("scaled:0.5", False),
     ("wrong_shard", False), ("copy", False), ("stale", False), ("precision_claim", False)],
)  # fmt: skip
def test_a_segment_check_passes_honest_work_and_fails_lazy_work(
    make_agent,
    submit,
    always_checked,
    tmp_path,
    monkeypatch,
    cheat,
    passes,
    django_capture_on_commit_callbacks,
) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    source = None
    if cheat in task_runner.COPIERS:
        # an update made earlier by another run: another seed stands for another shard's
        # batches (copy) or another round's (stale); the server cannot tell them apart
        other = dict(task, seed=task["seed"] + 1)
        source = _run_task(agent, other, tmp_path / "earlier")
    if cheat:
        monkeypatch.setenv(task_runner.BYZANTINE_ENV, cheat)
    payload = _run_task(agent, task, tmp_path / "task", source)
    assert agent.upload(task["id"], payload, {"steps": task["steps"]}).status_code == 202
    check = SegmentCheck.objects.get(result__task_id=task["id"])
    assert check.status == CheckStatus.REQUESTED and check.boundaries[-1] == task["steps"]
    asked = _reveal_all(agent, tmp_path / "task", django_capture_on_commit_callbacks)
    assert asked[0]["task_id"] == task["id"] and 0 in asked[0]["steps"]
    check.refresh_from_db()
    assert check.status == (CheckStatus.PASSED if passes else CheckStatus.FAILED), check.reason
    node = Node.objects.get(pk=agent.node_id)
    assert (node.verified_ok, node.verified_bad) == ((1, 0) if passes else (0, 1))
    result = TaskResult.objects.get(task_id=task["id"])
    assert result.accepted is passes
    if passes:
        assert check.distance == 0.0 and check.rerun_steps * 4 == check.task_steps
        assert overhead() == {"checks": 1, "rerun_steps": check.rerun_steps,
                              "task_steps": task["steps"]}  # fmt: skip
    elif cheat.startswith("scaled"):  # an honest chain that does not end at the update
        assert "uploaded update" in check.reason
    elif cheat == "precision_claim":  # its checkpoints hold the fp16 loss scaler
        assert "fp16 loss scaling" in check.reason and result.precision == "fp32"
    else:  # half_steps, wrong_shard, copy, stale: the segment re-run lands elsewhere
        assert check.distance > check.tolerance, check.reason


def test_a_checkpoint_that_does_not_match_its_commitment_fails(
    make_agent, submit, always_checked, tmp_path
) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload = _run_task(agent, task, tmp_path / "task")
    assert agent.upload(task["id"], payload).status_code == 202
    request = agent.client.get("/api/v1/agent/proofs").json()["requests"][0]
    step = request["steps"][-1]
    other = (tmp_path / "task" / task_runner.CHECKPOINT.format(0)).read_bytes()
    if step == 0:
        other = (tmp_path / "task" / task_runner.CHECKPOINT.format(task["steps"])).read_bytes()
    response = agent.client.put(f"/api/v1/agent/proofs/{request['id']}/checkpoints/{step}",
                                data=other, content_type="application/octet-stream")  # fmt: skip
    assert response.json() == {"status": "failed"}
    assert Node.objects.get(pk=agent.node_id).verified_bad == 1


def test_a_node_that_reveals_nothing_by_the_deadline_fails(
    make_agent, submit, always_checked, tmp_path
) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    assert agent.upload(task["id"], _run_task(agent, task, tmp_path / "t")).status_code == 202
    assert expire_overdue() == 0
    SegmentCheck.objects.update(deadline=timezone.now() - timedelta(seconds=1))
    assert expire_overdue() == 1
    assert SegmentCheck.objects.get().status == CheckStatus.FAILED
    assert TaskResult.objects.get(task_id=task["id"]).accepted is False
    assert agent.client.get("/api/v1/agent/proofs").json() == {"requests": []}


def test_uploads_are_not_checked_at_share_zero(make_agent, submit, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(settings.GPUFLEX, "SEGMENT_CHECK_SHARE", 0.0)
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    assert agent.upload(task["id"], _run_task(agent, task, tmp_path / "t")).status_code == 202
    assert not SegmentCheck.objects.exists()


def test_a_missing_proof_fails_where_proofs_are_required(
    make_agent, submit, always_checked, tmp_path, monkeypatch
) -> None:
    monkeypatch.setitem(settings.GPUFLEX, "SEGMENT_PROOF_REQUIRED", True)
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload, metrics = agent.train(task)  # the test stand-in's update: no commitments
    assert agent.upload(task["id"], payload, metrics).status_code == 202
    check = SegmentCheck.objects.get()
    assert check.status == CheckStatus.FAILED and "no proof" in check.reason
    assert TaskResult.objects.get(task_id=task["id"]).accepted is False


def test_a_segment_the_verifier_cannot_rerun_is_skipped_not_held_against_the_node(
    make_agent, submit, always_checked, tmp_path, django_capture_on_commit_callbacks
) -> None:
    from marketplace.jobs import files
    from marketplace.rounds.models import Task

    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    assert agent.upload(task["id"], _run_task(agent, task, tmp_path / "t")).status_code == 202
    files.delete_tree([Task.objects.get(pk=task["id"]).shard.file])  # the worker's input gone
    _reveal_all(agent, tmp_path / "t", django_capture_on_commit_callbacks)
    check = SegmentCheck.objects.get()
    assert check.status == CheckStatus.SKIPPED and "not re-run" in check.reason
    node = Node.objects.get(pk=agent.node_id)
    assert (node.verified_ok, node.verified_bad) == (0, 0)
    assert TaskResult.objects.get(task_id=task["id"]).accepted is True


def test_a_segment_check_stands_in_for_a_replica_and_probation_checks_every_upload(
    make_agent, submit, tmp_path, monkeypatch
) -> None:
    """With checks on, a provable task of a new volunteer gets no replica at its lease (a
    quarter of the task re-run instead of all of it), and every upload of a node on
    probation is checked; a trusted node's at SEGMENT_CHECK_SHARE."""
    from marketplace.proofs.services import check_share
    from marketplace.rounds.models import Task

    monkeypatch.setitem(settings.GPUFLEX, "SEGMENT_CHECK_SHARE", 0.25)
    agent = make_agent()  # a volunteer, new: on probation
    node = Node.objects.get(pk=agent.node_id)
    assert check_share(node) == 1.0
    job = submit(tier="volunteer")
    task = agent.claim()
    assert not Task.objects.filter(round__job_id=job["id"], replica=1).exists()
    assert agent.upload(task["id"], _run_task(agent, task, tmp_path / "t")).status_code == 202
    assert SegmentCheck.objects.get().node_id == agent.node_id  # drawn at 1.0
    Node.objects.filter(pk=node.pk).update(verified_ok=settings.GPUFLEX["TRUST_AFTER_VERIFIED"])
    assert check_share(Node.objects.get(pk=node.pk)) == 0.25
    Node.objects.filter(pk=node.pk).update(verified_bad=1)  # once caught, on probation again
    assert check_share(Node.objects.get(pk=node.pk)) == 1.0


def test_an_upload_without_the_proof_its_lease_counted_on_is_replicated(
    make_agent, submit, monkeypatch
) -> None:
    from marketplace.rounds.models import Task

    monkeypatch.setitem(settings.GPUFLEX, "SEGMENT_CHECK_SHARE", 0.25)
    agent = make_agent()  # new: every task would be replicated without proofs
    job = submit(tier="volunteer")
    task = agent.claim()
    assert not Task.objects.filter(round__job_id=job["id"], replica=1).exists()
    payload, metrics = agent.train(task)  # the test stand-in's update: an older agent's
    assert agent.upload(task["id"], payload, metrics).status_code == 202
    assert not SegmentCheck.objects.exists()
    replica = Task.objects.get(round__job_id=job["id"], replica=1)
    assert replica.shard_id == Task.objects.get(pk=task["id"]).shard_id


def test_a_task_that_cannot_commit_to_a_chain_is_still_replicated(
    make_agent, submit, monkeypatch
) -> None:
    """Top-k's upload adds its residual from earlier tasks: no chain ends in it, so no proof
    can stand in for the replica (trainer.proof_commitment.provable)."""
    import copy

    from marketplace.rounds.models import Task
    from tests.marketplace.helpers import SMALL_SPEC

    monkeypatch.setitem(settings.GPUFLEX, "SEGMENT_CHECK_SHARE", 0.25)
    agent = make_agent()
    spec = copy.deepcopy(SMALL_SPEC)
    spec["compression"] = {"codec": "topk"}
    job = submit(tier="volunteer", spec=spec)
    agent.claim()
    assert Task.objects.filter(round__job_id=job["id"], replica=1).exists()
