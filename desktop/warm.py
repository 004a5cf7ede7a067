"""The agent's side of the warm task worker (desktop/task_zygote.py runs inside the sandbox).

One zygote per sandbox, started on the first task under the same bubblewrap confinement and
limits as a cold task, with one writable folder: `<tasks>/.warm/`. A task's folder is moved
in there for the time it runs and moved back after, so a task sees its own folder and no
other. The zygote forks one child per task; the agent watches that child as it watched a cold
task process (wall clock, resident memory, cancel) and kills its process group, never the
zygote, when it must stop. A zygote that dies is started again for the next task.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from desktop.entry import entry_argv

WARM_DIR = ".warm"
START_TIMEOUT_S = 120.0  # importing torch on a busy machine


def zygote_argv(run_dir: Path) -> list[str]:
    return entry_argv("desktop.task_zygote", "_zygote", str(run_dir))


@dataclass
class Outcome:
    code: int | None  # the child's exit code (negative: killed by that signal)
    killed: tuple[str, str] | None  # (status, detail) when the agent stopped it
    stderr_tail: str
    events: list[dict[str, Any]] = field(default_factory=list)


class WarmWorker:
    """A running zygote for one run folder; `run` trains one task at a time through it."""

    def __init__(self, run_dir: Path, popen: Callable[[list[str], Path], subprocess.Popen]):
        self.run_dir = run_dir
        self._popen = popen
        self._proc: subprocess.Popen[bytes] | None = None
        self._zygote: psutil.Process | None = None
        self._lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._stderr = bytearray()
        self._err_total = 0  # bytes ever read from stderr: marks survive trimming
        self._events: list[dict[str, Any]] = []  # the running task's progress events
        self._on_event: Callable[[dict[str, Any]], None] | None = None
        self._lock = threading.Lock()  # one start or task at a time (prewarm runs in a thread)
        self._closed = threading.Event()
        self.child: psutil.Process | None = None

    # ------------------------------------------------------------------ lifecycle

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def prewarm(self) -> None:
        """Start the zygote now, in the background, so the first task does not wait for it."""

        def go() -> None:
            with self._lock:
                if not self.alive():
                    with contextlib.suppress(OSError, RuntimeError):  # the first task retries
                        self.start()
            # the zygote dies with the thread that started it (bwrap's --die-with-parent and
            # PR_SET_PDEATHSIG follow the parent *thread*): stay until it is closed
            self._closed.wait()

        threading.Thread(target=go, name="gpuflex-prewarm", daemon=True).start()

    def start(self) -> None:
        self._closed.clear()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lines, self._stderr, self._err_total = [], bytearray(), 0
        proc = self._proc = self._popen(zygote_argv(self.run_dir), self.run_dir)
        for target in (self._read_stdout, self._read_stderr):
            threading.Thread(target=target, args=(proc,), daemon=True).start()
        ready = self._wait_for(lambda e: e.get("zygote") == "ready", START_TIMEOUT_S)
        if ready is None:
            tail = self._stderr.decode("utf-8", "replace")[-500:]
            self.close()
            raise RuntimeError(f"the warm task worker did not start: {tail.strip()}")
        self._zygote = _find_zygote(proc.pid)

    def close(self) -> None:
        self._closed.set()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin:
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for p in (self._zygote, self.child):
            if p is not None:
                found.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    found |= {c.pid for c in p.children(recursive=True)}
        return found

    # ------------------------------------------------------------------ one task

    def run(
        self,
        folder: Path,
        command: dict[str, Any],
        watch: Callable[[psutil.Process | None], tuple[str, str] | None],
        on_event: Callable[[dict[str, Any]], None] | None,
    ) -> Outcome:
        """Move `folder` in, run `command` in a forked child, move it back out."""
        with self._lock:  # after a prewarm still starting
            return self._run(folder, command, watch, on_event)

    def _run(self, folder: Path, command: dict[str, Any], watch: Any, on_event: Any) -> Outcome:
        if not self.alive():
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        inside = self.run_dir / folder.name
        shutil.rmtree(inside, ignore_errors=True)
        folder.rename(inside)
        try:
            with self._cond:
                self._lines.clear()
                self._events = []
            err_mark = self._err_total
            self._on_event = on_event
            before = self._children()
            args = [str(inside) if a == str(folder) else a for a in command["argv"]]
            line = json.dumps(command | {"folder": str(inside), "argv": args}) + "\n"
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
            except OSError:
                return Outcome(None, ("sandbox", "the warm task worker is gone"), self._tail(0))
            killed = None
            exited = None
            while exited is None:
                if self.child is None:
                    self.child = next(iter(self._children() - before), None)
                killed = killed or watch(self.child)
                if killed and self.child is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.child.pid, 9)
                exited = self._wait_for(lambda e: e.get("zygote") == "exited", 0.1)
                if exited is None and not self.alive():
                    detail = "the warm task worker died: " + self._tail(err_mark)[-300:]
                    return Outcome(None, killed or ("crashed", detail), self._tail(err_mark))
            time.sleep(0.05)  # the stderr reader catches up with the child's last words
            with self._cond:
                events = self._events[-50:]
            return Outcome(int(exited["code"]), killed, self._tail(err_mark), events)
        finally:
            self.child, self._on_event = None, None
            with contextlib.suppress(OSError):
                inside.rename(folder)

    # ------------------------------------------------------------------ plumbing

    def _children(self) -> set[psutil.Process]:
        if self._zygote is None:
            return set()
        try:
            return set(self._zygote.children())
        except psutil.Error:
            return set()

    def _read_stdout(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            event = parse_event(raw)
            if event is None:
                continue
            if "zygote" not in event:
                if self._on_event is not None:
                    self._on_event(event)
                with self._cond:
                    self._events.append(event)
                    del self._events[:-50]
                continue
            with self._cond:
                self._lines.append(event)
                self._cond.notify_all()

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
            self._stderr.extend(chunk)
            self._err_total += len(chunk)
            del self._stderr[:-65536]

    def _wait_for(
        self, match: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any] | None:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, event in enumerate(self._lines):
                    if match(event):
                        del self._lines[: i + 1]
                        return event
                left = end - time.monotonic()
                if left <= 0 or (self._proc is not None and self._proc.poll() is not None):
                    return None
                self._cond.wait(min(left, 0.5))

    def _tail(self, mark: int) -> str:
        """What stderr got since `mark`, the last 2,000 characters of it."""
        n = min(self._err_total - mark, len(self._stderr))
        return bytes(self._stderr[-n:] if n > 0 else b"").decode("utf-8", "replace")[-2000:]


def parse_event(raw: bytes) -> dict[str, Any] | None:
    """One line a task printed, if it is a JSON object (progress, phase); anything else and
    anything over 4 KiB is not an event."""
    try:
        event = json.loads(raw[:4096])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _find_zygote(pid: int) -> psutil.Process | None:
    """The zygote's host process: under bubblewrap it is a descendant of the bwrap process we
    started (bwrap's own command line names the zygote too, so skip bwrap)."""
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                cmd = p.cmdline()
                if os.path.basename(cmd[0]) != "bwrap" and any("zygote" in a for a in cmd):
                    return p
    except psutil.Error:
        pass
    return None


def recover(tasks_dir: Path) -> None:
    """Folders a crashed agent left inside the warm folder go back where the journal looks."""
    warm = tasks_dir / WARM_DIR
    if not warm.is_dir():
        return
    for left in warm.iterdir():
        target = tasks_dir / left.name
        if target.exists():
            shutil.rmtree(left, ignore_errors=True)
        else:
            left.rename(target)
