"""Which processes on this machine are GPUFlex's own, so that the work policy never pauses
for them as "another program uses the GPU".

NVML lists every process holding a CUDA context. On a GPU owner's machine that includes
GPUFlex itself: the agent, other agents on the same host (platform servers run several), their
sandboxed tasks, the tray app, and `gpuflex demo`'s coordinator. A process counts as GPUFlex's
when it, or any process it descends from, was started as one of GPUFlex's programs: a
`gpuflex*` executable or script (the console scripts, the PyInstaller bundle) or
`python -m` one of GPUFlex's packages. Descent covers the tasks, which run under bubblewrap
as children of their agent. A program the owner starts is never a child of GPUFlex, so a
game is still seen.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

# `python -m` targets that are GPUFlex programs (the desktop agent and its task runner, the
# marketplace's server, worker and demo, the simulator, the benchmarks)
_MODULE_PREFIXES = ("desktop.", "marketplace.", "trainer.", "bench.")
_PROGRAM_PREFIX = "gpuflex"
_MAX_DEPTH = 32  # ancestry walk bound: process trees are shallow, a loop must not hang us
_LOG = logging.getLogger(__name__)
# pids already explained in the log: a game holding the GPU for an hour is logged once
_explained: set[int] = set()
_EXPLAINED_MAX = 4096


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    cmdline: tuple[str, ...]


def is_gpuflex_cmdline(cmdline: Iterable[str]) -> bool:
    """Whether a command line starts one of GPUFlex's programs."""
    argv = list(cmdline)
    if not argv:
        return False
    if _is_program(argv[0]):
        return True
    # an interpreter running a script or a module: python [options] script | -m module
    if not _stem(argv[0]).startswith(("python", "pypy", "py")):
        return False
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, "").startswith(_MODULE_PREFIXES)
        if arg.startswith("-m"):  # python -mdesktop.cli
            return arg[2:].startswith(_MODULE_PREFIXES)
        if arg in ("-c", "-") or arg.startswith("-c"):
            return False
        if arg in ("-W", "-X"):  # options that take the next word as their value
            next(args, None)
        elif not arg.startswith("-"):
            return _is_program(arg)  # the script
    return False


def _stem(path: str) -> str:
    name = os.path.basename(path.replace("\\", "/")).lower()
    return name.removesuffix(".exe")


def _is_program(path: str) -> bool:
    return _stem(path).startswith(_PROGRAM_PREFIX)


def _lookup(pid: int) -> ProcessInfo | None:
    try:
        p = psutil.Process(pid)
        return ProcessInfo(pid, p.ppid(), tuple(p.cmdline()))
    except (psutil.Error, OSError):
        return None  # gone, or not ours to read (another user's process)


def ancestry(pid: int, lookup: Callable[[int], ProcessInfo | None] = _lookup) -> list[ProcessInfo]:
    """`pid` and the processes it descends from, nearest first, as far as they can be read;
    it stops at the first GPUFlex program."""
    chain: list[ProcessInfo] = []
    seen: set[int] = set()
    while pid > 0 and pid not in seen and len(seen) < _MAX_DEPTH:
        seen.add(pid)
        info = lookup(pid)
        if info is None:
            break
        chain.append(info)
        if is_gpuflex_cmdline(info.cmdline):
            break
        pid = info.ppid
    return chain


def is_gpuflex_process(pid: int, lookup: Callable[[int], ProcessInfo | None] = _lookup) -> bool:
    """True when `pid` or one of its ancestors is a GPUFlex program."""
    chain = ancestry(pid, lookup)
    return bool(chain) and is_gpuflex_cmdline(chain[-1].cmdline)


def explain(pid: int, lookup: Callable[[int], ProcessInfo | None] = _lookup) -> str:
    """Why `pid` counts as another program, for the agent's log: the ancestry walked, each
    process as `pid:command line`, or that the pid cannot be read in this process's view
    (NVML can report pids of another pid namespace, e.g. the host's from inside a container)."""
    chain = ancestry(pid, lookup)
    if not chain:
        return f"pid {pid} cannot be read here (gone, another user's, or another pid namespace)"
    steps = " <- ".join(f"{i.pid}:{' '.join(i.cmdline)[:120] or '?'}" for i in chain)
    end = chain[-1]
    why = "no GPUFlex program among its ancestors"
    if end.ppid > 1 and lookup(end.ppid) is None:
        why = f"its parent {end.ppid} cannot be read"
    return f"{steps} ({why})"


def foreign(
    procs: Iterable[tuple[int, int]],
    own_pids: set[int] | None = None,
    lookup: Callable[[int], ProcessInfo | None] = _lookup,
) -> list[tuple[int, int]]:
    """The (pid, MB) entries of `procs` that belong to programs other than GPUFlex."""
    mine = (own_pids or set()) | {os.getpid()}
    others = [(p, mb) for p, mb in procs if p not in mine and not is_gpuflex_process(p, lookup)]
    for pid, mb in others:
        # once per pid: what the work policy pauses for must be explainable from the log
        # (a GPU run once paused for "python3" and nothing said which process that was)
        if pid not in _explained:
            if len(_explained) >= _EXPLAINED_MAX:
                _explained.clear()
            _explained.add(pid)
            _LOG.info("another program uses the GPU (%d MB): %s", mb, explain(pid, lookup))
    return others
