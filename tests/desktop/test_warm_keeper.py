"""The warm task worker starts when work is offered and stops after `warm_idle_s` (#32 item 2).

The keeper alone, against a recording sandbox and a fake clock; then a real agent whose
worker stops after a short quiet period and starts again for the next task."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from fake_marketplace import digits_task
from test_agent_loop import make_agent, wait_for

from desktop.config import InvalidSettings, Settings, apply_changes
from desktop.health import _worker
from desktop.warm_keeper import WarmKeeper


class RecordingSandbox:
    def __init__(self) -> None:
        self.state = "cold"
        self.calls: list[str] = []

    def warm_state(self) -> str:
        return self.state

    def start_warm(self, tasks_dir: Path) -> None:
        self.calls.append("start")
        self.state = "warm"

    def close(self) -> None:
        self.calls.append("close")
        self.state = "cold"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_worker_starts_on_work_and_stops_after_the_quiet_period(tmp_path: Path) -> None:
    sandbox, clock = RecordingSandbox(), Clock()
    keeper = WarmKeeper(sandbox, tmp_path, lambda: 300.0, clock)
    assert keeper.state() == "idle" and sandbox.calls == []  # no work yet: nothing started
    assert not keeper.cool()

    keeper.offered()
    assert sandbox.calls == ["start"] and keeper.state() == "warm"
    keeper.offered()  # already running: not started twice
    assert sandbox.calls == ["start"]
    clock.now += 299
    keeper.used()  # a task ended: the quiet period starts now
    clock.now += 299
    assert not keeper.cool()
    clock.now += 200
    assert not keeper.cool(busy=True)  # an overlap continuation trains in it
    clock.now += 299
    assert not keeper.cool()
    clock.now += 2
    assert keeper.cool() and sandbox.calls == ["start", "close"]
    assert keeper.state() == "idle"
    assert not keeper.cool()  # stopped once

    keeper.offered()  # the next task starts it again
    assert sandbox.calls == ["start", "close", "start"] and keeper.state() == "warm"


def test_zero_stops_it_as_soon_as_the_work_is_done(tmp_path: Path) -> None:
    sandbox, clock = RecordingSandbox(), Clock()
    keeper = WarmKeeper(sandbox, tmp_path, lambda: 0.0, clock)
    keeper.offered()
    keeper.used()
    assert keeper.cool() and sandbox.state == "cold"


def test_warm_idle_s_is_validated() -> None:
    assert Settings().warm_idle_s == 300
    assert apply_changes(Settings(), {"warm_idle_s": 0}).warm_idle_s == 0.0
    for bad in (-1, float("nan"), "soon"):
        with pytest.raises(InvalidSettings, match="warm_idle_s"):
            apply_changes(Settings(), {"warm_idle_s": bad})


def _zygotes() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("task_zygote" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm workers: Linux")
def test_an_idle_agent_stops_its_worker_and_the_next_task_starts_it(
    market, logged_in, isolated_dirs, fake_bench, monkeypatch
) -> None:
    monkeypatch.setenv("GPUFLEX_WARM_TASKS", "1")
    agent = make_agent(replace(logged_in, warm_idle_s=0.2), isolated_dirs, fake_bench)
    stopped = lambda: sum("warm task worker stopped" in e.message for e in agent.logs(500))  # noqa: E731
    agent.start()
    try:
        wait_for(lambda: agent.status().registered, what="registration")
        assert agent.warm_state() == "idle" and _worker(agent) == "ok"  # ready with no worker
        assert _zygotes() == []  # a node with no work holds only the agent

        market.add(digits_task("t-1"))
        wait_for(lambda: agent.status().completed == 1, what="the first task")
        wait_for(lambda: stopped() == 1, what="the worker stopping after the quiet period")
        wait_for(lambda: _zygotes() == [], what="the worker's process to be gone")
        assert agent.warm_state() == "idle" and _worker(agent) == "ok"

        market.add(digits_task("t-2"))  # starts it again, and trains through it
        wait_for(lambda: agent.status().completed == 2, what="the second task")
        wait_for(lambda: stopped() == 2, what="the worker stopping again")
    finally:
        agent.stop()
    assert sorted(market.accepted()) == ["t-1", "t-2"]
    assert market.tasks["t-1"].failed == [] and market.tasks["t-2"].failed == []
