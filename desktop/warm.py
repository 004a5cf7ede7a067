"""The agent's side of the warm task worker (desktop/task_zygote.py runs inside the sandbox).

One zygote per sandbox, started on the first task under the same bubblewrap confinement and
limits as a cold task, with one writable folder: `<tasks>/.warm/task/`, bound in as a cold
task's folder is (a mount point in a read-only parent, so no task can rename it, replace it
with a symlink, or write beside it: #38). `.warm/` itself is the agent's alone. For the time
a task runs, the files of its folder are moved (renamed, by name in opened folders) into that
one folder, and all that is there then is moved back after, so a task sees its own files and
no other's, everything it writes counts in its folder's quota and comes back to its own
folder, and the task's folder itself never moves. The zygote forks one child per task; the
agent watches that child as it watched a cold task process (wall clock, resident memory,
cancel) and kills its process group, never the zygote, when it must stop. A zygote that dies
is started again for the next task.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from desktop.entry import entry_argv
from desktop.task_folder import UnsafeFolder, open_folder

WARM_DIR = ".warm"
WARM_SLOT = "task"  # <tasks>/.warm/task: the zygote's one writable folder
OWNER = "owner"  # <tasks>/.warm/owner: the name of the task folder whose files are in the slot
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
    """A running zygote for one run folder; `run` trains one task at a time through it.
    `popen(argv, run_dir, run_fd)` starts the zygote with `run_dir` (opened at `run_fd`) as
    its one writable folder."""

    def __init__(
        self, run_dir: Path, popen: Callable[[list[str], Path, int], subprocess.Popen]
    ) -> None:
        self.run_dir = run_dir
        self.current: Path | None = None  # the task folder whose files are in run_dir now
        self._popen = popen
        self._warm_fd: int | None = None  # run_dir's parent and run_dir, opened
        self._run_fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._zygote: psutil.Process | None = None
        self._lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._stderr = bytearray()
        self._err_total = 0  # bytes ever read from stderr: marks survive trimming
        self._events: list[dict[str, Any]] = []  # the running task's progress events
        self._on_event: Callable[[dict[str, Any]], None] | None = None
        # one start or task at a time (prewarm runs in a thread); reentrant: a start that fails
        # closes the worker from within
        self._lock = threading.RLock()
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
        self._open_folders()
        assert self._run_fd is not None
        self._lines, self._stderr, self._err_total = [], bytearray(), 0
        proc = self._proc = self._popen(zygote_argv(self.run_dir), self.run_dir, self._run_fd)
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
        # the folders' descriptors: now, unless a task runs (its own thread holds the lock),
        # whose run closes them once its files are back (it sees the zygote gone)
        if self._lock.acquire(blocking=False):
            try:
                self._close_folders()
            finally:
                self._lock.release()
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
        folder_fd: int,
        command: dict[str, Any],
        watch: Callable[[psutil.Process | None], tuple[str, str] | None],
        on_event: Callable[[dict[str, Any]], None] | None,
    ) -> Outcome:
        """Move the files of `folder` (opened at `folder_fd`) in, run `command` in a forked
        child, move what is there then back out."""
        with self._lock:  # after a prewarm still starting
            try:
                return self._run(folder, folder_fd, command, watch, on_event)
            finally:
                if self._proc is None:  # closed while the task ran
                    self._close_folders()

    def _run(
        self, folder: Path, folder_fd: int, command: dict[str, Any], watch: Any, on_event: Any
    ) -> Outcome:
        if not self.alive():
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        assert self._warm_fd is not None and self._run_fd is not None
        warm_fd, run_fd = self._warm_fd, self._run_fd
        inside = self.run_dir
        empty(run_fd)  # whatever a signal left after the last task moved out
        _write_owner(warm_fd, folder.name)  # a crash now: recover() knows whose files these are
        try:
            move_all(folder_fd, run_fd)
            self.current = folder
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
            self.current = None
            with contextlib.suppress(OSError):
                os.chmod(run_fd, 0o755)  # the task's to change, the agent's to read back
            move_all(run_fd, folder_fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(OWNER, dir_fd=warm_fd)

    def _open_folders(self) -> None:
        """`.warm/` (the agent's alone: one an older agent gave to its tasks is taken back,
        anything but a folder in its place removed) and the slot in it, opened."""
        if self._run_fd is not None:
            return
        warm = self.run_dir.parent
        warm_fd = _open_own(warm)
        try:
            if hasattr(os, "geteuid"):
                with contextlib.suppress(PermissionError):
                    os.fchown(warm_fd, os.geteuid(), os.getegid())
            os.fchmod(warm_fd, 0o755)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.run_dir.name, 0o755, dir_fd=warm_fd)
            try:
                run_fd = open_folder(self.run_dir)
            except UnsafeFolder:  # not a folder of ours: replaced by one
                remove(self.run_dir.name, warm_fd)
                os.mkdir(self.run_dir.name, 0o755, dir_fd=warm_fd)
                run_fd = open_folder(self.run_dir)
        except BaseException:
            os.close(warm_fd)
            raise
        self._warm_fd, self._run_fd = warm_fd, run_fd

    def _close_folders(self) -> None:
        for fd in (self._warm_fd, self._run_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._warm_fd = self._run_fd = None

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
    """Files a crashed agent left in the warm folder go back to their task's folder, where the
    journal looks; anything else in the warm folder goes."""
    warm = tasks_dir / WARM_DIR
    if not os.path.lexists(warm):
        return
    warm_fd = _open_own(warm)
    try:
        owner = _read_owner(warm_fd)
        for name in os.listdir(warm_fd):
            if name == WARM_SLOT:
                if owner:
                    with contextlib.suppress(OSError):
                        _recover_slot(warm_fd, tasks_dir / owner)
                continue
            if name != OWNER and _is_dir(name, warm_fd) and not os.path.lexists(tasks_dir / name):
                with contextlib.suppress(OSError):  # an older agent's: a task folder moved in
                    os.rename(name, tasks_dir / name, src_dir_fd=warm_fd)
                    continue
            remove(name, warm_fd)
    finally:
        os.close(warm_fd)


def _recover_slot(warm_fd: int, folder: Path) -> None:
    run_fd = os.open(WARM_SLOT, _DIR_FLAGS, dir_fd=warm_fd)
    try:
        try:
            folder_fd = open_folder(folder, create=True)
        except OSError:  # its folder is no folder of ours any more: its files go
            empty(run_fd)
            return
        try:
            move_all(run_fd, folder_fd)
        finally:
            os.close(folder_fd)
    finally:
        os.close(run_fd)


# ---------------------------------------------------------------------- files, by descriptor

_DIR_FLAGS = (
    os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)  # fmt: skip


def _open_own(warm: Path) -> int:
    """`warm` opened as a folder of the agent's, made (anew, if something else was there)."""
    try:
        return open_folder(warm, create=True)
    except UnsafeFolder:
        if os.path.isdir(warm) and not os.path.islink(warm):
            shutil.rmtree(warm)
        else:
            os.unlink(warm)
        return open_folder(warm, create=True)


def _is_dir(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def remove(name: str, dir_fd: int) -> None:
    """Remove the entry `name` of the opened folder, a folder with all in it; never follows a
    symlink."""
    with contextlib.suppress(FileNotFoundError):
        if _is_dir(name, dir_fd):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)


def empty(dir_fd: int) -> None:
    for name in os.listdir(dir_fd):
        remove(name, dir_fd)


def move_all(src_fd: int, dst_fd: int) -> None:
    """Rename every entry of one opened folder into another (the same file system): a file
    or folder of the same name there is replaced, and an entry that still cannot move goes."""
    for name in os.listdir(src_fd):
        try:
            os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            continue
        except FileNotFoundError:
            continue
        except OSError:
            pass
        remove(name, dst_fd)
        try:
            os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        except OSError:
            remove(name, src_fd)


def _write_owner(warm_fd: int, name: str) -> None:
    """The agent's note of whose files the slot holds, through a temporary file of its own."""
    tmp = f".{OWNER}.{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o644, dir_fd=warm_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(name)
    os.rename(tmp, OWNER, src_dir_fd=warm_fd, dst_dir_fd=warm_fd)


def _read_owner(warm_fd: int) -> str | None:
    try:
        fd = os.open(OWNER, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=warm_fd)
    except OSError:
        return None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        name = f.read(512).strip()
    return name if name and "/" not in name and name not in (".", "..", WARM_DIR) else None
