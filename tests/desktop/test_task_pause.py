"""A cancelled task pauses at a step boundary, saves its state and later resumes from it to
the update an unpaused run makes; one that does not pause in time is killed (desktop.sandbox's
PAUSE_GRACE_S, desktop.task_runner, trainer.resume)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from fake_marketplace import digits_task

from desktop import task_runner
from desktop.sandbox import PAUSE_GRACE_S, Limits, Sandbox
from trainer.updates import decode_state


def _folder(path: Path, t) -> Path:
    path.mkdir(parents=True)
    (path / "task.json").write_text(json.dumps(t.task))
    (path / "model.safetensors").write_bytes(t.model)
    (path / "shard.safetensors").write_bytes(t.shard)
    return path


def _update(folder: Path) -> dict[str, torch.Tensor]:
    return decode_state((folder / "update.safetensors").read_bytes())[0]


def test_a_paused_task_resumes_to_the_update_an_unpaused_one_makes(
    tmp_path: Path, task_start: str
) -> None:
    t = digits_task("t-pause", steps=300, rows=300)
    whole = _folder(tmp_path / "whole", t)
    # the reference runs where the paused one does, in the sandbox: the same torch threads
    # (a float sum's order, hence its bits, depends on them)
    with Sandbox(Limits(wall_s=120, memory_mb=4096)) as sandbox:
        assert sandbox.run_task(whole).ok

    folder = _folder(tmp_path / "paused", t)
    # asked to pause before it starts, so that it pauses at a known step (0), whatever the
    # machine's speed; pausing mid-run is tested in process (tests/trainer/test_resume.py) and
    # through the agent (test_agent_loop.py::test_a_game_starting_mid_task…)
    (folder / task_runner.PAUSE).touch()

    def should_stop() -> str | None:  # the owner pauses
        return "paused by you"

    with Sandbox(Limits(wall_s=120, memory_mb=4096)) as sandbox:
        sandbox.pause_grace_s = 60.0  # a loaded machine: the hand-over is tested, not speed
        first = sandbox.run_task(folder, should_stop)
        assert first.status == "cancelled", (first.detail, first.stderr_tail)
        assert "paused at a step boundary" in first.detail
        paused = json.loads((folder / "result.json").read_text())
        assert paused["status"] == "paused" and paused["steps"] == 0
        assert (folder / task_runner.PAUSED).is_file()

        # what the agent does before the next attempt (desktop.agent): the request goes
        (folder / task_runner.PAUSE).unlink()
        (folder / "result.json").unlink()
        events: list[dict] = []
        second = sandbox.run_task(folder, None, events.append)
    assert second.status == "ok", (second.detail, second.stderr_tail)
    notes = [e["note"] for e in events if "note" in e]
    assert f"resuming after {paused['steps']} steps" in notes
    assert not (folder / task_runner.PAUSED).exists()  # used up
    expected, got = _update(whole), _update(folder)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_paused_state_left_by_another_task_is_dropped_and_the_task_trains_in_full(
    tmp_path: Path,
) -> None:
    a = _folder(tmp_path / "a", digits_task("t-a", steps=40))
    (a / task_runner.PAUSE).touch()
    assert task_runner.run(a) == task_runner.EXIT_PAUSED
    b = _folder(tmp_path / "b", digits_task("t-b", steps=40))
    (b / task_runner.PAUSED).write_bytes((a / task_runner.PAUSED).read_bytes())
    assert task_runner.run(b) == task_runner.EXIT_OK
    c = _folder(tmp_path / "c", digits_task("t-b", steps=40))
    assert task_runner.run(c) == task_runner.EXIT_OK
    assert all(torch.equal(_update(b)[k], _update(c)[k]) for k in _update(c))


def test_a_task_that_does_not_pause_is_killed_after_the_grace(
    tmp_path: Path, task_start: str
) -> None:
    """A program that never looks at the pause file (a continuation between steps, a stuck
    task) is stopped anyway, PAUSE_GRACE_S after the request."""
    asked = []

    def should_stop() -> str | None:
        asked.append(1)
        return "the work policy: another program uses the GPU" if len(asked) > 3 else None

    code = "import time\nprint('{\"progress\": 0.5}', flush=True)\nwhile True: time.sleep(0.05)"
    with Sandbox(Limits(wall_s=60, memory_mb=1024)) as sandbox:
        assert sandbox.pause_grace_s == PAUSE_GRACE_S <= 1.0  # the owner's 2 s, with detection
        sandbox.pause_grace_s = 0.2
        result = sandbox.run(tmp_path / "stuck", [sys.executable, "-c", code], should_stop)
    assert result.status == "cancelled"
    assert "did not pause within 0.2 s" in result.detail
    assert (tmp_path / "stuck" / task_runner.PAUSE).exists()  # it was asked first
