"""The one object between Qt and the agent: agent events hop onto the UI thread here.

The agent calls subscribers from its own threads; those calls only enqueue. A QTimer on the
UI thread drains the queue and re-emits as Qt signals, and polls the agent's immutable status
snapshot, so widgets never touch the agent from another thread and never block.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from desktop.agent import Agent, AgentStatus, Event, LogEntry
from desktop.config import Settings


class AgentBridge(QObject):
    status_changed = Signal(object)  # AgentStatus
    log_added = Signal(object)  # LogEntry
    notify = Signal(str, str)  # title, message
    stopped = Signal()

    def __init__(self, agent: Agent, poll_ms: int = 250, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.agent = agent
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._last: AgentStatus | None = None
        agent.subscribe(self._events.put)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._drain)
        self._timer.start(poll_ms)

    @property
    def status(self) -> AgentStatus:
        return self.agent.status()

    def _drain(self) -> None:
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            if kind == "log" and isinstance(payload, LogEntry):
                self.log_added.emit(payload)
                if payload.level == "error":
                    self.notify.emit("GPUFlex: problem", payload.message)
            elif kind == "task_done" and payload.get("ok"):
                self.notify.emit("Task finished", f"Task {payload['id']} was uploaded.")
        status = self.agent.status()
        if status != self._last:
            self._last = status
            self.status_changed.emit(status)

    # --- commands: all return at once; anything slow runs off the UI thread

    def start(self) -> None:
        self.agent.start()

    def toggle_pause(self) -> None:
        if self.agent.status().paused:
            self.agent.resume()
        else:
            self.agent.pause()
        self._drain()

    def pause(self) -> None:
        self.agent.pause()
        self._drain()

    def resume(self) -> None:
        self.agent.resume()
        self._drain()

    def save_settings(self, settings: Settings, provider_key: str | None = None) -> None:
        self.agent.update_settings(settings)
        if provider_key:
            self.agent.login(provider_key)

    def shutdown(self) -> None:
        """Stop the agent in a worker thread (it may wait for a task to wind down)."""
        self._timer.stop()

        def stop() -> None:
            self.agent.stop()
            self.stopped.emit()

        threading.Thread(target=stop, name="gpuflex-stop", daemon=True).start()


class Worker(QObject):
    """Runs a function in a thread and delivers its result (or exception) on the UI thread."""

    done = Signal(object)
    failed = Signal(object)

    def __init__(self, fn: Callable[[], Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._fn = fn

    def start(self) -> None:
        def run() -> None:
            try:
                result = self._fn()
            except Exception as exc:
                self.failed.emit(exc)
            else:
                self.done.emit(result)

        threading.Thread(target=run, name="gpuflex-worker", daemon=True).start()
