"""The agent with overlap tasks against the fake marketplace, with the real sandbox: the
update uploads while the runner trains on, and the job's next task merges that progress."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fake_marketplace import FakeTask, digits_task
from test_agent_loop import make_agent, wait_for

from desktop import task_runner
from trainer.updates import decode_state


def _overlap_task(task_id: str, rnd: int, overlap: bool = True) -> FakeTask:
    t = digits_task(task_id, steps=20)
    t.task |= {"round": rnd, "overlap": overlap}
    return t


def _expected(tmp_path: Path, t: FakeTask, progress: bytes | None) -> dict[str, torch.Tensor]:
    """The task's update from the in-process runner, given `progress` or none."""
    folder = tmp_path / f"expected-{t.task['id']}-{'merged' if progress else 'plain'}"
    folder.mkdir()
    (folder / "task.json").write_text(json.dumps(t.task))
    (folder / "model.safetensors").write_bytes(t.model)
    (folder / "shard.safetensors").write_bytes(t.shard)
    if progress is not None:
        (folder / task_runner.PROGRESS).write_bytes(progress)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    return decode_state((folder / "update.safetensors").read_bytes())[0]


def _close(sent: bytes, expected: dict[str, torch.Tensor]) -> None:
    got = decode_state(sent)[0]
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v)


def _run_two(market, agent, isolated_dirs, first: FakeTask, second: FakeTask) -> bytes:
    """`first`, then, once its continuation's progress is kept, `second`; returns that
    progress as the agent kept it."""
    kept = isolated_dirs.tasks.parent / "progress" / "job-1.safetensors"
    market.add(first)
    agent.start()
    try:
        wait_for(lambda: first.task["id"] in market.accepted(), what="the first update")
        wait_for(kept.exists, what="the progress of training on")
        progress = kept.read_bytes()
        market.add(second)
        wait_for(lambda: second.task["id"] in market.accepted(), what="the second update")
        wait_for(lambda: agent.status().completed == 2, what="completion")
    finally:
        agent.stop()
    return progress


def test_the_next_task_of_the_job_merges_the_progress_made_while_uploading(
    market, logged_in, isolated_dirs, fake_bench, tmp_path
):
    first, second = _overlap_task("t-1", 1), _overlap_task("t-2", 2)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    progress = _run_two(market, agent, isolated_dirs, first, second)
    assert market.puts == [("t-1", 201), ("t-2", 201)]
    _close(market.accepted()["t-1"], _expected(tmp_path, first, None))
    # t-2 started from its model + t-1's progress: its update is the runner's given that
    _close(market.accepted()["t-2"], _expected(tmp_path, second, progress))
    plain = _expected(tmp_path, second, None)
    sent = decode_state(market.accepted()["t-2"])[0]
    assert any(not torch.allclose(sent[k], plain[k]) for k in plain)  # it did merge
    logs = [e.message for e in agent.logs(500)]
    assert any("t-1: uploading, training on" in m for m in logs)
    assert any("t-2: starts from the model plus the progress" in m for m in logs)
    assert not list(isolated_dirs.tasks.glob("*.continue")), "continuations are cleaned up"
    assert not (isolated_dirs.tasks.parent / "progress" / "job-1.safetensors").exists()


def test_a_task_without_overlap_never_gets_progress(
    market, logged_in, isolated_dirs, fake_bench, tmp_path
):
    first, second = _overlap_task("t-3", 1), _overlap_task("t-4", 2, overlap=False)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    _run_two(market, agent, isolated_dirs, first, second)
    _close(market.accepted()["t-4"], _expected(tmp_path, second, None))
    assert not any("starts from the model plus" in e.message for e in agent.logs(500))
    # the chain is broken: the progress is dropped, not kept for a later task
    assert not (isolated_dirs.tasks.parent / "progress" / "job-1.safetensors").exists()
