"""The status window shows a runtime pack's download on first need, and which runtime tasks
train with (issue 32: progress in the CLI, the tray and the local API)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from desktop.agent import AgentStatus, State
from desktop.agent_status import TaskStatus
from desktop.gui.status_window import StatusWindow, runtime_fetch, runtime_line


class _Bridge(QObject):
    """What the window reads of desktop.gui.bridge.AgentBridge: its status and signals."""

    status_changed = Signal(object)
    log_added = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.status = AgentStatus(state=State.IDLE)

    def logs(self) -> list:
        return []

    def toggle_pause(self) -> None:
        pass


def test_a_downloading_pack_fills_the_current_task_card(qtbot) -> None:
    bridge = _Bridge()
    window = StatusWindow(bridge)
    qtbot.addWidget(window)
    fetch = {"fetch": {"bytes": 90 * 2**20, "total": 360 * 2**20}}
    bridge.status_changed.emit(AgentStatus(state=State.IDLE, runtime=fetch))
    assert window.task_label.text() == "Getting ready to train"
    assert window.task_detail.text() == "Downloading the training runtime · 25% of 360 MiB"
    assert window.progress.value() == 250
    # installed: the card is free again, and a task's own progress wins over it
    done = {"plan": "cpu", "torch": "2.13.0", "cuda": "", "source": "pack"}
    bridge.status_changed.emit(AgentStatus(state=State.IDLE, runtime=done))
    assert window.task_label.text() == "No task right now"
    assert window.progress.value() == 0
    task = TaskStatus(id="t-1", job_id="j-1", round=1, phase="training", progress=0.5, started=0)
    bridge.status_changed.emit(AgentStatus(state=State.WORKING, task=task, runtime=fetch))
    assert window.progress.value() == 500


def test_runtime_lines() -> None:
    assert runtime_fetch({}) is None
    assert runtime_fetch({"fetch": {"bytes": 5, "total": 0}}) == (
        "Downloading the training runtime · 0%", 0.0)  # fmt: skip
    pack = {"plan": "cuda13", "torch": "2.13.0+cu130", "cuda": "13.0", "source": "pack"}
    assert runtime_line(pack) == "runtime cuda13 (pack), torch 2.13.0+cu130, CUDA 13.0"
    env = {"plan": "cpu", "torch": "2.13.0", "cuda": "", "source": "environment"}
    assert runtime_line(env) == "runtime cpu (this environment), torch 2.13.0"
    assert runtime_line({}) == ""
