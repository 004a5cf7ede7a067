"""`gpuflex-node run`: the agent as this user's background service.

The instance lock is taken before anything else (a second agent on the same data folder is
refused, naming the running one's pid), then the agent starts and the local API listens
(desktop.local_api). It runs until SIGTERM, Ctrl-C or `POST /stop`; closing the tray app
never stops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from desktop.agent import Agent
from desktop.config import Paths
from desktop.local_api import LocalApi
from desktop.service_lock import InstanceLock


class Daemon:
    def __init__(self, agent: Agent, lock: InstanceLock, transport: str | None = None) -> None:
        self.agent = agent
        self.lock = lock
        self.api = LocalApi(agent, transport)

    @classmethod
    def open(
        cls, paths: Paths, make_agent: Callable[[], Agent], transport: str | None = None
    ) -> Daemon:
        """Raises service_lock.AlreadyRunning before the agent is even built."""
        lock = InstanceLock(paths.data).acquire()
        try:
            return cls(make_agent(), lock, transport)
        except BaseException:
            lock.release()
            raise

    def start(self) -> Daemon:
        self.agent.start()
        self.api.start()
        return self

    def close(self) -> None:
        self.agent.stop()
        self.api.close()
        self.lock.release()

    def run_forever(self) -> None:
        """Blocks until the agent stops (POST /stop, or a crash) or KeyboardInterrupt."""
        self.start()
        try:
            while self.agent.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.agent._info("stopping (signal)")
        finally:
            self.close()
