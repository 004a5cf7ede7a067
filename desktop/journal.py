"""A crash-safe record of this node's tasks, so that a crash or restart loses none and
submits none twice.

An append-only JSON-lines file, fsynced after every entry. Each task moves through
claimed → ready (inputs on disk) → trained (update on disk, its hash recorded) → done
(uploaded, or its failure reported). On start the agent picks up every task not done: one
that was trained is uploaded again with the very same bytes (the API answers 200 to a repeat,
so a crash between upload and journal costs nothing), anything earlier is trained again.
A torn last line from a crash mid-write is skipped.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATES = ("claimed", "ready", "trained", "done")


@dataclass
class TaskRecord:
    id: str
    state: str
    task: dict[str, Any]
    update_sha256: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    outcome: str = ""  # for done: "uploaded" | "failed:<reason>" | "lost" | "refused"
    attempts: int = 0  # training runs started, to give up on a task that keeps killing us
    downloads: int = 0  # times its inputs were fetched: a corrupt download is fetched once more
    # an upload answered 202 (received, checked later by the server: desktop.upload_outcomes):
    # "checking" while asked about, then "accepted", "refused" (outcome "refused" too, the
    # server's reason in `refusal`) or "unknown" (no answer in time); "" for any other
    check: str = ""
    check_asks: int = 0
    refusal: str = ""
    updated: float = 0.0


class Journal:
    def __init__(self, path: Path, readonly: bool = False) -> None:
        """`readonly` for onlookers (`status`, tests): only the agent owning it may compact."""
        self.path = path
        self._lock = threading.Lock()
        self.tasks: dict[str, TaskRecord] = {}
        self._load()
        if not readonly:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._compact()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                entry = json.loads(line)
                self._apply(entry)
            except (ValueError, KeyError, TypeError):
                continue  # a torn write from a crash; everything before it stands

    def _apply(self, e: dict[str, Any]) -> None:
        tid = str(e["id"])
        rec = self.tasks.get(tid)
        if rec is None:
            rec = self.tasks[tid] = TaskRecord(id=tid, state=e["state"], task=e.get("task", {}))
        rec.state = e["state"]
        for key in ("update_sha256", "metrics", "outcome", "attempts", "downloads", "task",
                    "check", "check_asks", "refusal"):  # fmt: skip
            if key in e:
                setattr(rec, key, e[key])
        rec.updated = float(e.get("t", 0.0))

    def _compact(self) -> None:
        """Rewrite with only unfinished tasks and the last few finished ones."""
        done = sorted(
            (r for r in self.tasks.values() if r.state == "done"), key=lambda r: r.updated
        )
        keep = {r.id for r in done[-200:]} | {r.id for r in self.open()}
        self.tasks = {k: v for k, v in self.tasks.items() if k in keep}
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for r in self.tasks.values():
                f.write(json.dumps(self._entry(r)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)

    @staticmethod
    def summary(r: TaskRecord) -> dict[str, Any]:
        """What the owner is told of a task (the local API's /tasks): not its spec or data."""
        return {
            "id": r.id, "job_id": r.task.get("job_id"), "round": r.task.get("round"),
            "state": r.state, "outcome": r.outcome, "check": r.check, "refusal": r.refusal,
            "attempts": r.attempts, "updated": r.updated,
        }  # fmt: skip

    @staticmethod
    def _entry(r: TaskRecord) -> dict[str, Any]:
        return {
            "id": r.id, "state": r.state, "task": r.task, "update_sha256": r.update_sha256,
            "metrics": r.metrics, "outcome": r.outcome, "attempts": r.attempts,
            "downloads": r.downloads, "check": r.check, "check_asks": r.check_asks,
            "refusal": r.refusal, "t": r.updated,
        }  # fmt: skip

    def record(self, task_id: str, state: str, **fields: Any) -> TaskRecord:
        if state not in STATES:
            raise ValueError(f"unknown journal state {state!r}")
        entry = {"id": task_id, "state": state, "t": time.time(), **fields}
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._apply(entry)
            return self.tasks[task_id]

    def get(self, task_id: str) -> TaskRecord | None:
        return self.tasks.get(task_id)

    # under the lock: the heartbeat thread reads while the work loop records
    def open(self) -> list[TaskRecord]:
        with self._lock:
            return [r for r in self.tasks.values() if r.state != "done"]

    def recent(self, n: int) -> list[TaskRecord]:
        """The `n` records changed last, newest first (the journal keeps every unfinished
        task and the last 200 finished)."""
        with self._lock:
            return sorted(self.tasks.values(), key=lambda r: r.updated, reverse=True)[:n]

    def finished(self) -> list[TaskRecord]:
        with self._lock:
            return [r for r in self.tasks.values() if r.state == "done"]
