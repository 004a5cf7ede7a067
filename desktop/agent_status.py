"""What the agent shows: its state, the running task, its log lines and, on a multi-GPU host,
each lane's line; immutable snapshots, safe to hand to any thread (desktop.agent re-exports
them for the CLI, the tray and the local API)."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from desktop.bench_result import BenchmarkResult
from desktop.hardware import HardwareReport


class State(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    IDLE = "idle"  # waiting for work from the marketplace
    WORKING = "working"
    PAUSED = "paused"  # by the owner
    WAITING = "waiting"  # the work policy says not now (in use, on battery, too hot...)
    ERROR = "error"  # cannot go on without help (not logged in, key revoked)

    @property
    def api(self) -> str:
        return {"working": "working", "paused": "paused", "waiting": "waiting"}.get(
            self.value, "idle"
        )


@dataclass(frozen=True)
class TaskStatus:
    id: str
    job_id: str
    round: int
    # "downloading" | "training" | "uploading"; for overlap: "uploading, training on" and,
    # once uploaded, "training on" (until the job's next task is in)
    phase: str
    progress: float  # 0..1 of training
    started: float


@dataclass(frozen=True)
class LogEntry:
    time: float
    level: str  # "info" | "warning" | "error"
    message: str
    seq: int = 0  # increasing per agent: a client asks for the lines after the last it saw

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "level": self.level, "message": self.message, "seq": self.seq}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogEntry:
        return cls(float(data["time"]), str(data["level"]), str(data["message"]),
                   int(data.get("seq", 0)))  # fmt: skip

    def __str__(self) -> str:
        return f"{dt.datetime.fromtimestamp(self.time):%H:%M:%S} {self.message}"


@dataclass(frozen=True)
class LaneStatus:
    """One GPU's lane of a multi-GPU agent (desktop.lanes): its node and what it does."""

    gpu: int
    gpu_name: str
    state: State = State.STOPPED
    reason: str = ""
    task: TaskStatus | None = None
    node_id: str = ""
    completed: int = 0
    failed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "state": self.state.value,
                "task": None if self.task is None else self.task.__dict__}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaneStatus:
        task = d.get("task")
        return cls(
            gpu=int(d["gpu"]), gpu_name=str(d.get("gpu_name", "")),
            state=State(d.get("state", "stopped")), reason=str(d.get("reason", "")),
            task=None if not task else TaskStatus(**task), node_id=str(d.get("node_id", "")),
            completed=int(d.get("completed", 0)), failed=int(d.get("failed", 0)),
        )  # fmt: skip

    def doing(self) -> str:
        """`waiting: another program uses the GPU (game)`, `working, task t-1 training 40%`."""
        what = self.state.value + (f": {self.reason}" if self.reason else "")
        if self.task is not None:
            what += f", task {self.task.id} {self.task.phase} {100 * self.task.progress:.0f}%"
        return what

    def line(self) -> str:
        """`GPU 1 (RTX 3080): waiting: ...`, for the tray and the status window."""
        return f"GPU {self.gpu} ({self.gpu_name}): {self.doing()}"


@dataclass(frozen=True)
class AgentStatus:
    state: State = State.STOPPED
    reason: str = ""  # why waiting, paused or in error, in words
    task: TaskStatus | None = None
    server: str = ""
    node_id: str = ""
    registered: bool = False
    earnings_today: str = "0.00"
    earnings_total: str = "0.00"
    # of the total, what waits out the server's payout hold (unverified work, docs/money.md)
    earnings_held: str = "0.00"
    completed: int = 0
    failed: int = 0
    isolated: bool = False  # tasks run under bubblewrap
    hardware: HardwareReport | None = None
    benchmark: BenchmarkResult | None = None
    network: dict[str, float | None] = field(default_factory=dict)
    last_error: str = ""
    lanes: tuple[LaneStatus, ...] = ()  # one per GPU on a multi-GPU machine, else none
    # the training runtime tasks run with (desktop/runtime_keeper.py): plan, torch, cuda,
    # source; while a pack downloads, {"fetch": {"bytes": …, "total": …}}
    runtime: dict[str, Any] = field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return self.state is State.PAUSED

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.value, "reason": self.reason,
            "task": None if self.task is None else self.task.__dict__,
            "server": self.server, "node_id": self.node_id, "registered": self.registered,
            "earnings": {"today": self.earnings_today, "total": self.earnings_total,
                         "held": self.earnings_held},
            "completed": self.completed, "failed": self.failed, "isolated": self.isolated,
            "network": self.network, "last_error": self.last_error, "updated": time.time(),
            "hardware": None if self.hardware is None else self.hardware.to_dict(),
            "benchmark": None if self.benchmark is None else self.benchmark.to_dict(),
            "lanes": [lane.to_dict() for lane in self.lanes],
            "runtime": self.runtime,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentStatus:
        """The snapshot as the local API carries it (desktop.control): the GUI's view."""
        task, hw, bench = d.get("task"), d.get("hardware"), d.get("benchmark")
        earnings = d.get("earnings") or {}
        return cls(
            state=State(d.get("state", "stopped")), reason=str(d.get("reason", "")),
            task=None if not task else TaskStatus(**task),
            server=str(d.get("server", "")), node_id=str(d.get("node_id", "")),
            registered=bool(d.get("registered")),
            earnings_today=str(earnings.get("today", "0.00")),
            earnings_total=str(earnings.get("total", "0.00")),
            earnings_held=str(earnings.get("held", "0.00")),
            completed=int(d.get("completed", 0)), failed=int(d.get("failed", 0)),
            isolated=bool(d.get("isolated")),
            hardware=None if not hw else HardwareReport.from_dict(hw),
            benchmark=None if not bench else BenchmarkResult.from_dict(bench),
            network=dict(d.get("network") or {}), last_error=str(d.get("last_error", "")),
            lanes=tuple(LaneStatus.from_dict(lane) for lane in d.get("lanes") or ()),
            runtime=dict(d.get("runtime") or {}),
        )  # fmt: skip


# ("log", LogEntry) | ("state", AgentStatus) | ("task_done", dict): a task uploaded ("ok")
# may be followed by one more task_done, outcome "refused" with its "reason", when the
# server's check refuses the upload it had received (desktop.upload_outcomes)
Event = tuple[str, Any]
