"""When the warm task worker runs: from when work is offered until a quiet period after it.

The warm worker (desktop/warm.py) holds torch and the trainer, about 300 MB resident. A node
with no work should hold only the agent, so the worker is started when work is offered (a
claimed task, or one the journal still holds, just before its inputs are fetched: torch
imports while they download) and stopped once no task has used it for `warm_idle_s`
(desktop.config.Settings; 0: stopped as soon as the work is done). The next task starts it
again. A worker stopped for idleness is by design, so /readyz counts it as ready
(desktop/health.py): its state reads "idle".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class WarmSandbox(Protocol):
    """What the keeper needs of desktop.sandbox.Sandbox."""

    def warm_state(self) -> str: ...

    def start_warm(self, tasks_dir: Path) -> None: ...

    def close(self) -> None: ...


class WarmKeeper:
    """Starts and stops one sandbox's warm worker. Called from the agent's loop thread only:
    `offered` before a task is fetched, `used` after it, `cool` on each idle pass."""

    def __init__(
        self,
        sandbox: WarmSandbox,
        tasks_dir: Path,
        idle_s: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sandbox = sandbox
        self._tasks_dir = tasks_dir
        self._idle_s = idle_s  # read each time: a settings change applies at once
        self._clock = clock
        self._wanted = False  # work was offered and the quiet period has not passed
        self._last_use = clock()

    def offered(self) -> None:
        """Work came: the worker starts (in the background) unless it runs."""
        self._wanted = True
        self._last_use = self._clock()
        if self._sandbox.warm_state() == "cold":
            self._sandbox.start_warm(self._tasks_dir)

    def used(self) -> None:
        """A task (or a continuation) has just used the worker: the quiet period restarts."""
        self._last_use = self._clock()

    def cool(self, busy: bool = False) -> bool:
        """Stop the worker when nothing has used it for `warm_idle_s`; `busy`: something
        still runs in it (an overlap task's continuation). True when it was stopped now."""
        if busy:
            self.used()
            return False
        if not self._wanted or self._clock() - self._last_use < self._idle_s():
            return False
        self._wanted = False
        running = self._sandbox.warm_state() == "warm"
        self._sandbox.close()
        return running

    def state(self) -> str:
        """The sandbox's warm_state(), with "idle" for a worker down because no work wants
        it (before the first task, and after the quiet period) rather than "cold"."""
        state = self._sandbox.warm_state()
        return "idle" if state == "cold" and not self._wanted else state
