"""The one object between Qt and the agent, which runs as its own process (desktop.daemon):
the tray is a client of its local API (desktop.control), like `gpuflex-node status`.

A thread polls the API (status, and log lines after the last seen) and only enqueues; a
QTimer on the UI thread drains the queue and re-emits as Qt signals, so widgets never wait
on the agent. Commands (pause, settings, login) are single local requests. Closing the tray
only stops this polling: the agent goes on working, and another tray may attach to it.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from desktop.agent import AgentStatus, LogEntry, State
from desktop.config import Settings
from desktop.control import ControlClient, ControlError, NotRunning

_GONE = AgentStatus(state=State.STOPPED, reason="the agent is not running")


class AgentBridge(QObject):
    status_changed = Signal(object)  # AgentStatus
    log_added = Signal(object)  # LogEntry
    notify = Signal(str, str)  # title, message
    stopped = Signal()  # this tray is closing (the agent is not)

    def __init__(self, client: ControlClient, poll_ms: int = 500,
                 parent: QObject | None = None) -> None:  # fmt: skip
        super().__init__(parent)
        self.client = client
        self.poll_s = poll_ms / 1000
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._last_seq = 0
        self._status = _GONE
        self.login_info: dict[str, Any] = {"backend": "", "provider_key": False}
        self.agent_pid: int | None = None
        self.backlog: deque[LogEntry] = deque(maxlen=300)
        self._closing = threading.Event()
        self._poll_lock = threading.Lock()  # the poller and refresh(): one at a time
        self._poll()  # the first snapshot now: widgets built next show it at once
        self._drain(notify=False)
        self._thread = threading.Thread(target=self._poller, name="gpuflex-poll", daemon=True)
        self._thread.start()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._drain)
        self._timer.start(poll_ms)

    @property
    def status(self) -> AgentStatus:
        return self._status

    # --- polling: the thread asks, the UI thread applies

    def _poller(self) -> None:
        while not self._closing.wait(self.poll_s):
            self._poll()

    def _poll(self) -> None:
        with self._poll_lock:
            try:
                status = self.client.status()
                lines = self.client.logs(300, after=self._last_seq)
            except (NotRunning, ControlError) as exc:
                self._events.put(("gone", str(exc)))
                return
            if lines:
                self._last_seq = max(int(line["seq"]) for line in lines)
            self._events.put(("status", status))
            for line in lines:
                self._events.put(("log", LogEntry.from_dict(line)))

    def _drain(self, notify: bool = True) -> None:
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            if kind == "log":
                self.backlog.append(payload)
                if notify:
                    self.log_added.emit(payload)
                    if payload.level == "error":
                        self.notify.emit("GPUFlex: problem", payload.message)
            elif kind == "status":
                self.agent_pid = payload.get("pid")
                self.login_info = dict(payload.get("login") or self.login_info)
                self._apply(AgentStatus.from_dict(payload), notify)
            elif kind == "gone":
                self._apply(_GONE, notify)

    def _apply(self, status: AgentStatus, notify: bool) -> None:
        old, self._status = self._status, status
        if notify and status.completed > old.completed and old is not _GONE:
            done = status.completed - old.completed
            self.notify.emit("Task finished", f"{done} more task(s) uploaded; "
                                              f"{status.completed} this session.")  # fmt: skip
        if status != old:
            self.status_changed.emit(status)

    def refresh(self) -> None:
        """Poll now, on this thread: after a command, the widgets show its effect at once."""
        self._poll()
        self._drain()

    # --- commands

    def _command(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (NotRunning, ControlError) as exc:
            self.notify.emit("GPUFlex", str(exc))
            return None
        finally:
            self.refresh()

    def toggle_pause(self) -> None:
        if self._status.paused:
            self.resume()
        else:
            self.pause()

    def pause(self, reason: str = "") -> None:
        self._command(lambda: self.client.pause(reason))

    def resume(self) -> None:
        self._command(self.client.resume)

    def stop_agent(self) -> None:
        self._command(self.client.stop)

    def settings(self) -> Settings:
        return Settings.from_dict(self.client.settings())

    def logs(self) -> list[LogEntry]:
        return list(self.backlog)

    def save_settings(self, settings: Settings, provider_key: str | None = None) -> None:
        """Only the fields that changed go to the agent, which checks them; raises
        ControlError (its message says which field) or NotRunning."""
        old = self.client.settings()
        changes = {k: v for k, v in settings.to_dict().items() if old.get(k) != v}
        changes.pop("local_datasets", None)  # the Datasets page changes them (/datasets)
        if changes:
            self.client.update_settings(changes)
        if provider_key:
            self.client.login(provider_key)
        self.refresh()

    def close(self) -> None:
        """This tray goes; the agent does not."""
        self._closing.set()
        self._timer.stop()
        self.stopped.emit()


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
