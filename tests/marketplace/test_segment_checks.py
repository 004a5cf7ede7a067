"""Proof-of-learning segment checks (marketplace/proofs) through the agent API, with the real
task runner (desktop.task_runner) making the updates and checkpoints: an honest task passes,
a node that trained half the steps, or sent a scaled update, fails, and one that reveals
nothing by the deadline fails."""

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


def _run_task(agent, task, folder: Path) -> bytes:
    """What the real agent does with a claimed task: its folder, the sandboxed runner."""
    folder.mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps(task))
    (folder / "model.safetensors").write_bytes(agent.model(task["id"]).content)
    (folder / "shard.safetensors").write_bytes(agent.shard(task["id"]).content)
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
    ("cheat", "passes"), [("", True), ("half_steps", False), ("scaled:2", False)]
)
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
    if cheat:
        monkeypatch.setenv(task_runner.BYZANTINE_ENV, cheat)
    payload = _run_task(agent, task, tmp_path / "task")
    assert agent.upload(task["id"], payload, {"steps": task["steps"]}).status_code == 201
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
    elif cheat == "half_steps":
        assert check.distance > check.tolerance
    else:
        assert "uploaded update" in check.reason


def test_a_checkpoint_that_does_not_match_its_commitment_fails(
    make_agent, submit, always_checked, tmp_path
) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload = _run_task(agent, task, tmp_path / "task")
    assert agent.upload(task["id"], payload).status_code == 201
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
    assert agent.upload(task["id"], _run_task(agent, task, tmp_path / "t")).status_code == 201
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
    assert agent.upload(task["id"], _run_task(agent, task, tmp_path / "t")).status_code == 201
    assert not SegmentCheck.objects.exists()
