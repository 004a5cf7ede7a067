"""Every task in its own process: no network, only its folder writable, bounded CPU/memory/time.

Linux: bubblewrap (`bwrap`) with every namespace unshared (so no network), the Python
environment and project bound read-only, a private /tmp and /dev/shm (size-capped tmpfs, both
counted in the memory budget), a minimal /dev plus only the GPU device nodes the task needs, and
the task folder as the one writable place: bound from a descriptor the agent opened and
checked (desktop/task_folder.py), so a symlink in its place is refused, never followed, and
the task cannot rename or replace it (it is a mount point, in a read-only parent). bwrap itself
starts with an empty environment (the task's variables are passed with --setenv: a task
reading /proc/1/environ sees no agent secret), every capability is dropped, no namespace or
mount can be made inside (a seccomp filter, desktop/seccomp.py, and bwrap's --disable-userns
where bwrap makes a user namespace), and the task never runs as root: an agent running as root
starts the task through `setpriv` as the unprivileged SANDBOX_UID. A process limit
(RLIMIT_NPROC, set inside the sandbox by `prlimit` so that it counts the sandbox's processes
and threads) and a task-folder quota (a watchdog that kills a task whose folder outgrows
`folder_mb`) complete it.
Everywhere: rlimits (CPU seconds, data segment, file size, no core dumps) set in the child
before exec, a wall-clock limit and a resident-memory watchdog in the agent; on Windows a job object
(desktop/winjob.py) enforces CPU time, committed memory and a process count instead of
rlimits. Where bwrap is missing or unusable the task still gets the limits, and the agent logs
a warning that it is not isolated.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from desktop.entry import entry_argv
from desktop.runtime.active import PACKAGES_ENV as RUNTIME_PACKAGES_ENV
from desktop.seatbelt import seatbelt_argv, seatbelt_usable
from desktop.seccomp import filter_fd
from desktop.task_folder import (
    BY_FD,
    SANDBOX_GID,
    SANDBOX_UID,
    open_folder,
    plain,
)
from desktop.task_outputs import UnsafeOutput, is_regular, read_json_output
from desktop.task_runner import EXIT_PAUSED, PAUSE
from desktop.warm import WARM_DIR, WARM_SLOT, WarmWorker, parse_event, recover

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TASK_PACKAGES = ("desktop", "trainer")  # what desktop.task_runner imports of the project

EXIT_OOM = 3  # desktop.task_runner's code for MemoryError / CUDA OOM
# A cancelled task (the owner's pause, the work policy, the agent stopping) is first asked to
# pause: it saves its state at its next step boundary and exits, and resumes from there next
# time (desktop.task_runner, trainer.resume). One that has not exited within this grace is
# killed, and trains again from its start. Within the 2 s the owner's pause must take.
PAUSE_GRACE_S = 1.0

# where a federated task finds the owner's local dataset it trains on (bound read-only)
LOCAL_DATA_ROOT = "/gpuflex-local-data"
QUOTA_CHECK_S = 0.5  # how often the task-folder quota is measured
QUOTA_MAX_ENTRIES = 20000  # a task folder with more files than this is over its quota too


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 8192  # host memory (data segment and resident set)
    cpu_s: int = 3600  # CPU seconds, all threads together
    wall_s: float = 3600.0
    file_mb: int = 4096  # largest file the task may write (the update)
    procs: int = 1024  # processes and threads together (torch starts a thread per core)
    tmpfs_mb: int = 256  # each of /tmp and /dev/shm (at most an eighth of memory_mb)
    folder_mb: int = 16384  # everything in the task folder, its inputs included

    @property
    def tmpfs_size_mb(self) -> int:
        """The size of each of the task's /tmp and /dev/shm."""
        return max(1, min(self.tmpfs_mb, self.memory_mb // 8))

    @property
    def resident_mb(self) -> int:
        """The resident-memory watchdog's limit: what /tmp and /dev/shm may hold (memory too,
        but no process's resident set counts it) is taken out of memory_mb."""
        return max(1, self.memory_mb - 2 * self.tmpfs_size_mb)


class SandboxRefused(RuntimeError):
    """The sandbox cannot confine a task here (a tool it needs is missing)."""


@dataclass
class SandboxResult:
    status: str  # "ok" | "oom" | "timeout" | "crashed" | "sandbox" | "cancelled" | "quota"
    returncode: int | None
    detail: str = ""
    duration_s: float = 0.0
    isolated: bool = False  # ran under bubblewrap
    stderr_tail: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def bwrap_path() -> str | None:
    return shutil.which("bwrap") if sys.platform.startswith("linux") else None


_BWRAP_WORKS: dict[str, bool] = {}


def isolation() -> tuple[str, str]:
    """How far this machine's sandbox confines a task: ("full", how) or ("limits", what it
    lacks). Jobs that require `isolation: full` never go to a "limits" node."""
    if sys.platform == "win32":
        return ("limits", "limits only: a Windows job object caps memory, CPU time and "
                "processes; it does not isolate the network or the file system")  # fmt: skip
    if sys.platform == "darwin":
        if seatbelt_usable():
            return ("full", "Seatbelt (sandbox-exec): no network, only the task's folder "
                    "writable, the owner's files unreadable")  # fmt: skip
        return ("limits", "limits only: rlimits (sandbox-exec is missing)")
    if bwrap_usable():
        return ("full", "bubblewrap: no network, a read-only system, only the task's folder "
                "writable, no capability")  # fmt: skip
    return ("limits", "limits only: rlimits (bubblewrap is missing: apt install bubblewrap)")


def bwrap_usable() -> bool:
    """bwrap present *and* allowed to make namespaces (some kernels forbid it unprivileged)."""
    path = bwrap_path()
    if path is None:
        return False
    if path not in _BWRAP_WORKS:
        try:
            probe = subprocess.run(
                [path, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "true"],
                capture_output=True,
                timeout=10,
            )
            _BWRAP_WORKS[path] = probe.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_WORKS[path] = False
    return _BWRAP_WORKS[path]


_BWRAP_DISABLES_USERNS: dict[str, bool] = {}


def bwrap_disables_userns() -> bool:
    """bwrap can make the task's user namespace and forbid any further one in it
    (`--unshare-user --disable-userns`, bubblewrap 0.8): tried once, as a non-root agent's
    sandbox would run it."""
    path = bwrap_path()
    if path is None or _as_root():
        return False  # a root agent's tasks get no user namespace of bwrap's (bwrap_argv)
    if path not in _BWRAP_DISABLES_USERNS:
        try:
            probe = subprocess.run(
                [path, "--unshare-all", "--unshare-user", "--disable-userns",
                 "--ro-bind", "/", "/", "--dev", "/dev", "true"],
                capture_output=True, timeout=10,
            )  # fmt: skip
            _BWRAP_DISABLES_USERNS[path] = probe.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_DISABLES_USERNS[path] = False
    return _BWRAP_DISABLES_USERNS[path]


# GPU device nodes a CUDA/ROCm task needs; nothing else from the host's /dev
_GPU_DEVICES = (
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
    "/dev/kfd", "/dev/dri",
)  # fmt: skip


def gpu_device_nodes() -> list[str]:
    nodes = [p for p in _GPU_DEVICES if os.path.exists(p)]
    with contextlib.suppress(OSError):
        nodes += sorted(
            f"/dev/{n}" for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()
        )
    return nodes


def task_argv(folder: Path) -> list[str]:
    """The task runner's command line (a frozen app's hidden `_task` command)."""
    return entry_argv("desktop.task_runner", "_task", str(folder))


def _python_roots(folder: Path | None = None) -> list[Path]:
    """Where the interpreter, the venv and the installed packages live (bound read-only).

    Every entry of the agent's own `sys.path` is among them, not only the prefixes: packages
    are also reached through `PYTHONPATH`, `.pth` files and a venv layered on another
    environment (system-site-packages, conda, CUDA images with torch preinstalled), and a
    task that cannot see them fails with "No module named 'torch'". Two entries are left
    out: the working directory that `python -m` puts first (the owner's folder, not code), and
    any folder that holds the task's own, which would show the task its neighbours."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    roots |= {Path(os.path.realpath(sys.executable)).parent.parent}
    cwd = Path.cwd().resolve()
    task = folder.resolve() if folder is not None else None
    for entry in sys.path:
        path = Path(entry).resolve() if entry and os.path.isabs(entry) else None
        if path is None or path in (cwd, PROJECT_ROOT):  # the project: its code packages only
            continue
        if task is not None and (path == task or path in task.parents):
            continue
        roots.add(path)
    found = {r.resolve() for r in roots if r.exists()}
    # a folder inside another bound one needs no bind of its own
    return sorted(r for r in found if not any(o != r and o in r.parents for o in found))


def _pythonpath() -> str:
    """The task's PYTHONPATH: the project, then what the agent's own PYTHONPATH named (the
    task's interpreter rebuilds the rest of sys.path itself from the bound environment)."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    entries = [str(PROJECT_ROOT)] + [p for p in extra if os.path.isabs(p) and os.path.exists(p)]
    return os.pathsep.join(dict.fromkeys(entries))


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _tool(name: str) -> str:
    """A util-linux tool the sandbox runs inside bwrap (so it must live under /usr or /bin,
    which the sandbox binds)."""
    for place in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if os.access(f"{place}/{name}", os.X_OK):
            return f"{place}/{name}"
    raise SandboxRefused(
        f"the sandbox needs '{name}' (util-linux) in /usr/bin to confine tasks; install it"
    )


def _confine_argv(argv: list[str], limits: Limits) -> list[str]:
    """What runs inside bwrap before the task: `prlimit` sets the process limit there (inside
    the sandbox's user namespace it counts only the sandbox's processes), and for a root agent
    `setpriv` makes the task SANDBOX_UID with no capability, no group, no way back."""
    nproc = f"--nproc={limits.procs}:{limits.procs}"
    inner = [_tool("prlimit"), nproc, "--"]
    if _as_root():
        uid, gid = str(SANDBOX_UID), str(SANDBOX_GID)
        inner += [_tool("setpriv"), "--reuid", uid, "--regid", gid, "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--"]  # fmt: skip
    return [*inner, *argv]


def hand_to_task(folder_fd: int) -> None:
    """A root agent's task runs as SANDBOX_UID: give it its folder, opened and checked
    (desktop.task_folder), and the inputs in it, by name in that folder (a symlink is re-owned
    itself, never what it points to)."""
    if not _as_root():
        return
    os.fchown(folder_fd, SANDBOX_UID, SANDBOX_GID)
    for name in os.listdir(folder_fd):
        with contextlib.suppress(OSError):
            os.chown(name, SANDBOX_UID, SANDBOX_GID, dir_fd=folder_fd, follow_symlinks=False)


def bwrap_argv(
    folder: Path,
    argv: list[str],
    gpu: bool,
    env: dict[str, str] | None = None,
    limits: Limits | None = None,
    read_only: dict[str, str] | None = None,
    folder_fd: int | None = None,
    seccomp_fd: int | None = None,
    packages: Sequence[Path] = (),
) -> list[str]:
    """The bwrap command line; start it with an EMPTY environment (bwrap_env) and with
    `folder_fd` and `seccomp_fd` passed (Popen's pass_fds). `read_only`: host path -> where the
    task sees it (under LOCAL_DATA_ROOT), bound read-only. `folder_fd`: the task folder as
    opened by desktop.task_folder.open_folder, bound in at `folder` (so that the folder checked
    is the one bound, whatever its path names by then). `seccomp_fd`: desktop.seccomp's
    filter, loaded before the task starts. `packages`: a runtime pack's site-packages
    (desktop/runtime/active.py), bound read-only where it lies on the host."""
    bw = bwrap_path()
    assert bw is not None
    limits = limits or Limits()
    if _as_root():
        # no user namespace: it would map the task back to host root, whose processes no
        # RLIMIT_NPROC binds; setpriv drops to SANDBOX_UID instead (_confine_argv), and bwrap
        # keeps only the capabilities setpriv needs to do that
        args = [bw, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--cap-drop", "ALL"]  # fmt: skip
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        args = [bw, "--unshare-all", "--cap-drop", "ALL"]
        if bwrap_disables_userns():  # no user namespace in the task's: no mounts of its own
            args += ["--unshare-user", "--disable-userns"]
    if seccomp_fd is not None:  # no namespace, no mount, as root or not (desktop.seccomp)
        args += ["--seccomp", str(seccomp_fd)]
    args += ["--die-with-parent", "--new-session", "--clearenv"]
    # what exists in the sandbox: a folder, or with a trailing "/" a bound tree
    made: set[str] = {"/proc", "/dev", "/tmp", "/dev/shm"}
    # system libraries; on merged-/usr systems /lib, /bin... are symlinks into /usr
    args += _bind("--ro-bind", "/usr", made)
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += _bind("--ro-bind", top, made)
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        args += _bind("--ro-bind-try", etc, made)
    # a private /tmp and /dev/shm, sized so that they cannot eat the host's memory (their
    # size is taken out of the resident-memory budget: Limits.resident_mb)
    size = str(limits.tmpfs_size_mb * 2**20)
    args += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/dev/shm"):
        args += ["--perms", "1777", "--size", size, "--tmpfs", tmp]
    args += _bind("--ro-bind-try", "/sys/devices/system/cpu", made)
    # of the project, only the code a task runs: the project folder may also hold data (a
    # demo's folder with every agent's tasks in it) that a task must not see
    code = [PROJECT_ROOT / pkg for pkg in TASK_PACKAGES]
    if getattr(sys, "frozen", False):  # a bundle holds them in its archive, bound with Python
        code = []
    for root in [*_python_roots(folder), *code, *packages]:
        args += _bind("--ro-bind", str(root), made)
    if gpu:
        for node in gpu_device_nodes():
            args += _bind("--dev-bind", node, made)
        # the driver reads its PCI topology from sysfs
        args += _bind("--ro-bind-try", "/sys", made)
    # the owner's local datasets a federated task trains on: read-only, at LOCAL_DATA_ROOT
    for host, inside in (read_only or {}).items():
        args += _bind("--ro-bind", inside, made, source=host)
    # last, so it wins over any read-only bind above it (e.g. a folder inside the project); a
    # mount point in the read-only skeleton, which the task can neither rename nor replace
    if folder_fd is not None:
        args += _bind("--bind-fd", str(folder), made, source=str(folder_fd))
    else:
        args += _bind("--bind", str(folder), made)
    args += ["--chdir", str(folder)]
    args += ["--remount-ro", "/"]  # the skeleton root bwrap made is read-only too
    for key, value in {**_child_env(folder), **(env or {})}.items():
        args += ["--setenv", key, value]
    return [*args, "--", *_confine_argv(argv, limits)]


def _bind(flag: str, path: str, made: set[str], source: str | None = None) -> list[str]:
    """`flag path path` (`flag source path` with a source elsewhere), after the folders leading
    to it: bwrap would make them itself, but a root bwrap makes them 0700, which the task
    (SANDBOX_UID) cannot pass; made 0755 here."""
    args: list[str] = []
    for parent in reversed(Path(path).parents):
        name = str(parent)
        if name == "/" or name in made or any(m.endswith("/") and name.startswith(m) for m in made):
            continue  # exists already: made here, or inside a bound tree
        args += ["--perms", "0755", "--dir", name]
        made.add(name)
    made.add(path.rstrip("/") + "/")
    return [*args, flag, source or path, path]


def bwrap_env() -> dict[str, str]:
    """bwrap's own environment: empty. `--clearenv` cleans only the task's; bwrap and the init
    it leaves as the sandbox's pid 1 keep what they were started with, readable in
    /proc/1/environ (the agent's API key, once)."""
    return {}


_PASSED_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "GPUFLEX_DEVICE", "GPUFLEX_GPU_MEMORY_FRACTION",
)  # fmt: skip


# The task runs as a uid the sandbox's /etc has no passwd entry for (none is bound), so a
# library that asks who it runs as (getpass.getuser(), as torch's inductor does on CUDA for
# its cache folder) must find the answer in the environment: found on a lent H200, where every
# CUDA task failed with "getpwuid(): uid not found: 65534". Caches go in the task's folder.
TASK_USER = "gpuflex-task"


def _child_env(folder: Path) -> dict[str, str]:
    cache = str(folder / ".cache")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "USER": TASK_USER,
        "LOGNAME": TASK_USER,
        "XDG_CACHE_HOME": cache,
        "TORCHINDUCTOR_CACHE_DIR": cache + "/torchinductor",
        "TRITON_CACHE_DIR": cache + "/triton",
        "TMPDIR": "/tmp",
        "PYTHONPATH": _pythonpath(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8",
    }
    for key in _PASSED_ENV:
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _limit_child(limits: Limits, cap_data: bool) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec: keep it tiny
        import resource

        mb = 2**20
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if cap_data:
            resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_mb * mb, limits.memory_mb * mb))
        if sys.platform.startswith("linux"):
            # without bwrap's --die-with-parent, a crashed agent must not leave orphans
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return apply


class Sandbox:
    """Runs commands confined to one folder. `use_bwrap=None` picks bwrap where it works."""

    def __init__(
        self,
        limits: Limits | None = None,
        use_bwrap: bool | None = None,
        gpu: bool = False,
        warn: Callable[[str], None] | None = None,
        warm: bool | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.gpu = gpu
        self.env: dict[str, str] = {}  # extra variables for the task (e.g. the GPU memory cap)
        self.packages: list[Path] = []  # a runtime pack's site-packages (use_runtime)
        # the next task's modules for the warm worker to import before it forks that task
        # (task_zygote.ON_DEMAND, chosen by task_zygote.imports_for)
        self.imports: tuple[str, ...] = ()
        self.pause_grace_s = PAUSE_GRACE_S  # tests on a loaded machine give a task longer
        self._running: psutil.Process | None = None
        # bubblewrap on Linux, Seatbelt (sandbox-exec) on macOS: desktop/seatbelt.py
        confines = seatbelt_usable() if sys.platform == "darwin" else bwrap_usable()
        self.isolated = confines if use_bwrap is None else use_bwrap
        # Python tasks run through a warm worker (desktop/warm.py) on Linux: the sandbox and
        # `import torch` are paid once per agent instead of once per task. Not on macOS, where
        # forking a process that loaded Apple's frameworks is unsafe, nor on Windows (no fork)
        if warm is None:
            linux = sys.platform.startswith("linux")
            warm = linux and os.environ.get("GPUFLEX_WARM_TASKS", "1") != "0"
        self.warm = warm
        self._worker: WarmWorker | None = None
        if not self.isolated and warn is not None:
            missing = ("sandbox-exec is not available" if sys.platform == "darwin" else
                       "bubblewrap is not available")  # fmt: skip
            warn(f"{missing}: tasks run with resource limits only, without network or "
                 "filesystem isolation (install the 'bubblewrap' package on Linux)")  # fmt: skip

    def current_pids(self) -> set[int]:
        """Host pids of the running task's processes: its GPU use is ours, not a game's."""
        pids = self._worker.pids() if self._worker is not None else set()
        proc = self._running
        if proc is None:
            return pids
        try:
            return pids | {proc.pid, *(c.pid for c in proc.children(recursive=True))}
        except psutil.Error:
            return pids | {proc.pid}

    def signal(self, folder: Path, name: str) -> None:
        """Put an empty file `name` in a task's folder, and in the warm worker's folder while
        that task's files are in it, for the task to notice. Made by name in the opened
        folder with O_NOFOLLOW: a symlink the task put there is refused, never followed."""
        folder = plain(folder)
        places = [folder]
        worker = self._worker
        if worker is not None and worker.current == folder:
            places.insert(0, worker.run_dir)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
        for place in places:
            with contextlib.suppress(OSError):
                fd = open_folder(place)
                try:
                    os.close(os.open(name, flags, 0o644, dir_fd=fd))
                finally:
                    os.close(fd)

    def use_runtime(self, site_packages: Path | None) -> None:
        """Run tasks with a runtime pack's packages (desktop/runtime/active.py): its
        site-packages first on the task's PYTHONPATH, ahead of anything the agent's own
        environment holds, and bound read-only; None: the agent's environment is the runtime.
        A warm worker that imported the previous runtime is stopped (the next task starts
        one with this runtime)."""
        packages = [site_packages] if site_packages is not None else []
        if packages == self.packages:
            return
        self.packages = packages
        if site_packages is not None:
            self.env["PYTHONPATH"] = os.pathsep.join([str(site_packages), _pythonpath()])
            self.env[RUNTIME_PACKAGES_ENV] = str(site_packages)  # a frozen bundle's way in
        else:
            self.env.pop("PYTHONPATH", None)
            self.env.pop(RUNTIME_PACKAGES_ENV, None)
        self.close()

    def data_path(self, name: str, host: Path) -> str:
        """Where a task sees the local dataset at `host` (bound there read-only, see
        run_task's `read_only`); without bwrap, where it is."""
        if not self.isolated:
            return str(host)
        return f"{LOCAL_DATA_ROOT}/{name}{host.suffix if host.is_file() else ''}"

    def close(self) -> None:
        """Stop the warm worker, if one runs (the agent calls this when it stops)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_task(
        self,
        folder: Path,
        should_stop: Callable[[], str | None] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        read_only: dict[str, str] | None = None,
    ) -> SandboxResult:
        """Train the task in `folder` (see desktop.task_runner); `read_only` as bwrap_argv's
        (see `data_path`)."""
        argv = task_argv(plain(folder))
        result = self.run(folder, argv, should_stop, on_event, read_only)
        if result.status in ("ok", "crashed", "oom"):
            result = self._read_result(folder, result)
        return result

    def run(
        self,
        folder: Path,
        argv: list[str],
        should_stop: Callable[[], str | None] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        read_only: dict[str, str] | None = None,
    ) -> SandboxResult:
        """Run `argv` inside the sandbox; `should_stop` returning a reason cancels it.

        The folder is opened once here (desktop.task_folder: no symlink followed, the agent's
        or the sandbox's own), and that descriptor is what the task is handed and bound to,
        on a first run and on every retry alike."""
        folder = plain(folder)
        try:
            if BY_FD:
                folder_fd: int | None = open_folder(folder, create=True)
            else:  # Windows: no descriptor of a folder, and no sandbox a task could escape
                folder.mkdir(parents=True, exist_ok=True)
                folder_fd = None
        except OSError as exc:
            return SandboxResult("sandbox", None, f"could not confine the task: {exc}")
        try:
            return self._run(folder, folder_fd, argv, should_stop, on_event, read_only)
        finally:
            if folder_fd is not None:
                os.close(folder_fd)

    def _run(
        self,
        folder: Path,
        folder_fd: int | None,
        argv: list[str],
        should_stop: Callable[[], str | None] | None,
        on_event: Callable[[dict[str, Any]], None] | None,
        read_only: dict[str, str] | None,
    ) -> SandboxResult:
        # GPU drivers reserve huge private mappings; a data-segment cap would break CUDA, so
        # GPU tasks rely on the resident-memory watchdog (and the GPU's own memory cap)
        cap_data = not self.gpu
        python = _as_python_args(argv)
        pass_fds: list[int] = []  # bwrap's: the folder and the seccomp filter
        # the warm worker's sandbox was made before this task's binds were known: a task
        # that reads a local dataset runs cold, in a sandbox of its own
        if self.warm and python is not None and not read_only and folder_fd is not None:
            return self._run_warm(folder, folder_fd, python, cap_data, should_stop, on_event)
        if self.isolated and sys.platform == "darwin":
            if read_only:  # no bind mounts in Seatbelt: the runner would not find the data
                return SandboxResult("sandbox", None, "local datasets are not yet bound into "
                                     "the macOS sandbox")  # fmt: skip
            try:
                full = seatbelt_argv(folder, argv)
            except ValueError as exc:
                return SandboxResult("sandbox", None, f"could not confine the task: {exc}")
            env = {**_child_env(folder), **self.env}
        elif self.isolated:
            try:
                seccomp = filter_fd()
            except OSError as exc:
                return SandboxResult("sandbox", None, f"could not confine the task: {exc}")
            if seccomp is not None:
                pass_fds.append(seccomp)
            try:
                full = bwrap_argv(folder, argv, self.gpu, self.env, self.limits, read_only,
                                  folder_fd, seccomp, self.packages)  # fmt: skip
                if folder_fd is not None:
                    hand_to_task(folder_fd)
            except (SandboxRefused, OSError) as exc:
                _close(pass_fds)
                return SandboxResult("sandbox", None, f"could not confine the task: {exc}")
            if folder_fd is not None:
                pass_fds.append(folder_fd)
            env = bwrap_env()
        else:
            full = argv
            env = {**_child_env(folder), **self.env}
            env["PATH"] = os.environ.get("PATH", env["PATH"])
        job = None
        if sys.platform == "win32":
            from desktop.winjob import JobObject

            try:
                job = JobObject(self.limits, cap_memory=cap_data)
            except OSError as exc:
                return SandboxResult("sandbox", None, f"could not create a job object: {exc}")
        owned = [fd for fd in pass_fds if fd != folder_fd]  # the caller closes the folder's
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                full,
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as one
                preexec_fn=_limit_child(self.limits, cap_data) if os.name == "posix" else None,
                pass_fds=pass_fds,
            )
            if job is not None:
                # the runner is still importing Python: nothing has escaped the job yet
                job.assign(int(proc._handle))  # type: ignore[attr-defined]
        except OSError as exc:
            if job is not None:
                job.close()
            return SandboxResult("sandbox", None, f"could not start the task process: {exc}")
        finally:
            _close(owned)  # bwrap has its copies

        events: list[dict[str, Any]] = []
        stderr_tail = bytearray()
        grace = _Grace(lambda: self.signal(folder, PAUSE), self.pause_grace_s)
        on_event = grace.watch(on_event)

        def read_stdout() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                if (event := parse_event(raw)) is not None:
                    events.append(event)
                    del events[:-50]
                    if on_event is not None:
                        on_event(event)

        def read_stderr() -> None:
            assert proc.stderr is not None
            for chunk in iter(lambda: proc.stderr.read(4096), b""):  # type: ignore[union-attr]
                stderr_tail.extend(chunk)
                del stderr_tail[:-8192]

        readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
        for t in readers:
            t.start()

        killed: tuple[str, str] | None = None
        ps = self._running = _ps(proc.pid)
        quota = _Quota(folder, self.limits.folder_mb)
        while proc.poll() is None:
            killed = grace(self._must_stop(started, ps, should_stop, quota))
            if killed:
                if job is not None:
                    job.terminate()
                _kill_group(proc)
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)
        proc.wait()
        if job is not None:
            job.close()  # kills anything the task left behind
        self._running = None
        for t in readers:
            t.join(timeout=5)
        duration = time.monotonic() - started
        tail = stderr_tail.decode("utf-8", "replace")[-2000:]
        base = {"duration_s": duration, "isolated": self.isolated, "stderr_tail": tail,
                "events": events}  # fmt: skip
        killed = killed or grace.paused(proc.returncode)
        if killed:
            return SandboxResult(killed[0], proc.returncode, killed[1], **base)
        return SandboxResult(*_classify(proc.returncode, tail, self.limits), **base)

    def _must_stop(
        self,
        started: float,
        task: psutil.Process | None,
        should_stop: Callable[[], str | None] | None,
        quota: _Quota | None = None,
    ) -> tuple[str, str] | None:
        """(status, detail) when a running task must be killed: past its wall-clock, memory or
        folder limit, or cancelled; None while it may go on. Cold and warm tasks alike."""
        if time.monotonic() - started > self.limits.wall_s:
            return ("timeout", f"ran past its time limit of {self.limits.wall_s:g} s")
        if (rss := _tree_rss_mb(task)) > (resident := self.limits.resident_mb):
            return ("oom", f"used {rss} MB, over its memory limit of {self.limits.memory_mb} MB "
                    f"({resident} MB resident, the rest for /tmp and /dev/shm)")  # fmt: skip
        if quota is not None and (over := quota.over()):
            return ("quota", over)
        if should_stop is not None and (why := should_stop()):
            return ("cancelled", why)
        return None

    def _run_warm(
        self,
        folder: Path,
        folder_fd: int,
        args: list[str],
        cap_data: bool,
        should_stop: Callable[[], str | None] | None,
        on_event: Callable[[dict[str, Any]], None] | None,
    ) -> SandboxResult:
        worker = self._worker_for(folder.parent)
        started = time.monotonic()
        inside = worker.run_dir  # where the task's files are while it runs
        quota = _Quota(inside, self.limits.folder_mb)
        grace = _Grace(lambda: self.signal(folder, PAUSE), self.pause_grace_s)
        on_event = grace.watch(on_event)

        def watch(child: psutil.Process | None) -> tuple[str, str] | None:
            return grace(self._must_stop(started, child, should_stop, quota))

        command = {
            "argv": args,
            "env": {**_child_env(inside), **self.env},
            "cpu_s": self.limits.cpu_s,
            "data_mb": self.limits.memory_mb if cap_data else None,
            "file_mb": self.limits.file_mb,
            "procs": self.limits.procs,
            "imports": list(self.imports),
            # inside its own pid namespace and tmpfs the zygote clears what a task left behind
            "sweep": self.isolated,
        }
        try:
            if self.isolated:
                hand_to_task(folder_fd)
            out = worker.run(folder, folder_fd, command, watch, on_event)
        except (OSError, RuntimeError) as exc:
            self.close()
            return SandboxResult("sandbox", None, f"could not start the warm task worker: {exc}")
        base = {"duration_s": time.monotonic() - started, "isolated": self.isolated,
                "stderr_tail": out.stderr_tail, "events": out.events}  # fmt: skip
        if killed := out.killed or grace.paused(out.code):
            return SandboxResult(killed[0], out.code, killed[1], **base)
        assert out.code is not None
        return SandboxResult(*_classify(out.code, out.stderr_tail, self.limits), **base)

    def warm_state(self) -> str:
        """The warm task worker: "warm" (its zygote runs, torch imported), "cold" (not
        started yet, or gone: the next task starts it) or "off" (every task starts cold)."""
        if not self.warm:
            return "off"
        worker = self._worker
        return "warm" if worker is not None and worker.alive() else "cold"

    def prewarm(self, tasks_dir: Path) -> None:
        """Start the warm worker for tasks under `tasks_dir` before the first task comes,
        and bring back the task files a crash left in its folder."""
        self.recover(tasks_dir)
        self.start_warm(tasks_dir)

    def recover(self, tasks_dir: Path) -> None:
        """Bring back the task files a crash left in the warm worker's folder: only while
        no task runs through it (at the agent's start)."""
        if self.warm:
            # a warm folder that cannot be cleaned (not the agent's to remove) fails the
            # worker's start, and each task says why: the agent itself goes on
            with contextlib.suppress(OSError):
                recover(tasks_dir.resolve())

    def start_warm(self, tasks_dir: Path) -> None:
        """Start the warm worker in the background unless it runs (desktop.warm_keeper
        calls this when work is offered)."""
        if self.warm:
            worker = self._worker_for(tasks_dir.resolve())
            if not worker.alive():  # else each call would park one more prewarm thread
                worker.prewarm()

    def _worker_for(self, tasks_dir: Path) -> WarmWorker:
        run_dir = tasks_dir / WARM_DIR / WARM_SLOT
        if self._worker is None or self._worker.run_dir != run_dir:
            self.close()
            self._worker = WarmWorker(run_dir, self._start_zygote)
        return self._worker

    def _start_zygote(self, argv: list[str], run_dir: Path, run_fd: int) -> subprocess.Popen[bytes]:
        """The warm worker's process, confined as a cold task is, its one writable folder
        `run_dir` (opened at `run_fd`) bound in as a cold task's folder is; the per-task CPU,
        memory and file limits are set by the zygote in each task's child."""
        pass_fds: list[int] = []
        if self.isolated:
            if (seccomp := filter_fd()) is not None:
                pass_fds.append(seccomp)
            try:
                full = bwrap_argv(run_dir, argv, self.gpu, self.env, self.limits, None, run_fd,
                                  seccomp, self.packages)  # fmt: skip
                hand_to_task(run_fd)
            except BaseException:
                _close(pass_fds)
                raise
            env = bwrap_env()
        else:
            full, env = argv, {**_child_env(run_dir), **self.env}
            env["PATH"] = os.environ.get("PATH", env["PATH"])
        own = Limits(self.limits.memory_mb, 10**7, self.limits.wall_s, self.limits.file_mb)
        try:
            return subprocess.Popen(
                full, cwd=run_dir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_limit_child(own, cap_data=False), pass_fds=[*pass_fds, run_fd],
            )  # fmt: skip
        finally:
            _close(pass_fds)

    def _read_result(self, folder: Path, result: SandboxResult) -> SandboxResult:
        """The runner's own verdict (result.json) refines the exit code's. Read as a task
        output (desktop.task_outputs): a symlink is refused, never followed."""
        try:
            data = read_json_output(folder, "result.json")
        except UnsafeOutput as exc:
            if result.ok:
                result.status, result.detail = "crashed", str(exc)
            return result
        if data.get("status") == "failed":
            result.status = str(data.get("reason") or "crashed")[:64]
            result.detail = str(data.get("detail") or result.detail)[:1000]
        elif result.ok and not is_regular(folder, "update.safetensors"):
            result.status, result.detail = "crashed", "the task wrote no update"
        return result


class _Grace:
    """Turns the first cancellation of a task into a request to pause (`ask`, which puts the
    pause file in its folder), and into a kill only `grace_s` later. A task that reports it
    has paused (its state saved, the runner's "paused" event) is stopped at once: its
    interpreter's shutdown is no part of the owner's wait. Time, memory and folder limits
    still kill at once: a task over them gets no time to save anything."""

    def __init__(self, ask: Callable[[], None], grace_s: float) -> None:
        self.ask, self.grace_s = ask, grace_s
        self.asked_at: float | None = None
        self.saved = False
        self.why = ""

    def watch(
        self, on_event: Callable[[dict[str, Any]], None] | None
    ) -> Callable[[dict[str, Any]], None]:
        def relay(event: dict[str, Any]) -> None:
            if event.get("phase") == "paused":
                self.saved = True
            if on_event is not None:
                on_event(event)

        return relay

    def __call__(self, verdict: tuple[str, str] | None) -> tuple[str, str] | None:
        if verdict is None and self.asked_at is None:
            return None
        if verdict is not None and verdict[0] != "cancelled":
            return verdict
        if self.asked_at is None:
            assert verdict is not None
            self.asked_at, self.why = time.monotonic(), verdict[1]
            self.ask()
            return None
        if self.saved:
            return self._paused()
        if time.monotonic() - self.asked_at < self.grace_s:
            return None
        return ("cancelled", f"{self.why}; it did not pause within {self.grace_s:g} s, so it "
                "was stopped and will train again from its start")  # fmt: skip

    def paused(self, code: int | None) -> tuple[str, str] | None:
        """The verdict for a task that exited by itself after being asked to pause."""
        if self.asked_at is not None and (self.saved or code == EXIT_PAUSED):
            return self._paused()
        return None  # it finished (or failed) before it saw the request: that result stands

    def _paused(self) -> tuple[str, str]:
        return ("cancelled", f"{self.why}; paused at a step boundary, it resumes from there")


def _as_python_args(argv: list[str]) -> list[str] | None:
    """`python -m module …` / `python -c code …` (or a frozen app's `_task FOLDER`) as the
    arguments a warm worker runs; None for anything else, which runs cold."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] in ("-m", "-c"):
        return argv[1:]
    if len(argv) == 3 and argv[1] == "_task" and getattr(sys, "frozen", False):
        return ["-m", "desktop.task_runner", argv[2]]
    return None


def _classify(code: int, stderr: str, limits: Limits) -> tuple[str, int, str]:
    if code > 128 and code - 128 in _SIGNALS:  # bwrap reports its child's death by signal so
        code = -(code - 128)
    if code == 0:
        return "ok", code, ""
    if code == EXIT_OOM or "MemoryError" in stderr or "can't allocate memory" in stderr:
        return "oom", code, f"ran out of memory (limit {limits.memory_mb} MB)"
    if code == -signal.SIGXCPU:  # RLIMIT_CPU's soft limit
        return "timeout", code, f"used more than its {limits.cpu_s} CPU seconds"
    if "Resource temporarily unavailable" in stderr or "can't start new thread" in stderr:
        # fork/clone's EAGAIN: RLIMIT_NPROC
        return "crashed", code, (f"hit its process limit of {limits.procs} "
                                 "(processes and threads together)")  # fmt: skip
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return "crashed", code, f"killed by signal {name}"
    last = stderr.strip().splitlines()[-1:] or [""]
    return "crashed", code, f"exited with code {code}: {last[0][:300]}"


_SIGNALS = {int(s) for s in signal.Signals}


class _Quota:
    """The task-folder quota: the folder's disk use (allocated blocks, so a sparse file counts
    what it holds) measured every QUOTA_CHECK_S; a task over it is killed. Symlinks are not
    followed, and a folder with more than QUOTA_MAX_ENTRIES entries is over its quota too."""

    def __init__(self, folder: Path, folder_mb: int) -> None:
        self.folder, self.limit = folder, folder_mb * 2**20
        self._next = 0.0

    def over(self) -> str | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + QUOTA_CHECK_S
        used, entries, stack = 0, 0, [self.folder]
        while stack:
            with contextlib.suppress(OSError), os.scandir(stack.pop()) as found:
                for entry in found:
                    entries += 1
                    if entries > QUOTA_MAX_ENTRIES:
                        return f"made more than {QUOTA_MAX_ENTRIES} files in its folder"
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        used += getattr(st, "st_blocks", 0) * 512 or st.st_size
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
        if used > self.limit:
            return (f"wrote {used // 2**20} MB into its folder, over its quota of "
                    f"{self.limit // 2**20} MB")  # fmt: skip
        return None


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _ps(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _tree_rss_mb(proc: psutil.Process | None) -> int:
    if proc is None:
        return 0
    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
    except psutil.Error:
        return 0
    return total // 2**20


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if hasattr(os, "killpg"):  # POSIX: the task and everything it started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
