"""The warm task worker that runs INSIDE the sandbox: Python and torch imported once, then one
forked child per task.

Starting a task cold (bubblewrap, a fresh interpreter, `import torch`) costs seconds; a task on
a small model trains in a tenth of that. The zygote pays the start once. For each task the
agent sends one JSON line on stdin:

    {"folder": "/…/tasks/.warm/<id>", "argv": ["-m", "desktop.task_runner", FOLDER],
     "imports": ["trainer.dp_sgd"],
     "env": {...}, "cpu_s": 3600, "data_mb": 8192 | null, "file_mb": 4096, "procs": 1024,
     "sweep": true}

The zygote forks; the child starts a new session, enters the task's folder, takes the task's
rlimits and environment, and runs `argv` as `python ARGV` would (`-m module …` or `-c code`).
Its stdout and stderr are the zygote's, so progress events reach the agent unchanged. The
zygote waits for the child and answers one line, `{"zygote": "exited", "code": N}` (N as
subprocess reports it: negative for a signal). Each child is a copy of a process that never ran
a task, and exits when its task ends, so no task sees another's memory; the agent moves only
the running task's folder into the one folder the sandbox lets the zygote write. With "sweep"
(the zygote runs in bubblewrap's own pid namespace and tmpfs) it kills whatever the task left
running and empties /tmp and /dev/shm before it answers, so nothing of one task waits for the
next. The zygote runs with the same hardening as a cold task (desktop/sandbox.py: no
capability, not root, the process limit); each child takes its task's own limits.

The zygote never touches CUDA: a CUDA context does not survive fork, so each child makes its
own.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any

READY = {"zygote": "ready"}
# what every task needs, imported once: the heavy part of a cold start. torch._dynamo is what
# an optimizer's first step imports lazily (1.5 s here); importing runs no torch op, so no
# thread pool exists yet to be broken by fork. Not Opacus and the SciPy under it (65 MB, 2 s):
# only DP-SGD jobs (`privacy.mode: sample`) need them (ON_DEMAND).
WARM_IMPORTS = (
    "torch",
    "torch._dynamo",
    "desktop.task_runner",
    "trainer.compression",
    "trainer.local",
    "trainer.models",
)
# what only some jobs need: imported by the zygote when a task's command asks ("imports"),
# before it forks that task, and kept for the tasks after it; a worker that never runs such
# a task never holds them. Nothing else is imported on a command's word.
ON_DEMAND = frozenset({"trainer.dp_sgd"})


def imports_for(task: dict[str, Any]) -> tuple[str, ...]:
    """The ON_DEMAND modules `task` (a claimed task, its spec as JSON) will import: DP-SGD's
    for `privacy.mode: sample`. Read off the JSON: the agent imports no trainer."""
    spec = task.get("spec")
    privacy = spec.get("privacy") if isinstance(spec, dict) else None
    if isinstance(privacy, dict) and privacy.get("mode") == "sample":
        return ("trainer.dp_sgd",)
    return ()


def _import_on_demand(names: object) -> None:
    """The command's ON_DEMAND modules, once each; a failure is the task's to meet (its own
    import raises with the whole traceback), so the zygote goes on."""
    import importlib

    for name in names if isinstance(names, list) else ():
        if name in ON_DEMAND and name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # an import error, a broken install: the task says so
                sys.stderr.write(f"zygote: could not import {name}: {exc}\n")


def _say(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _child(cmd: dict[str, Any]) -> None:
    """In the forked child: become the task, then never return to the zygote's loop."""
    import resource

    code = 1
    try:
        os.setsid()  # its own process group: the agent kills the task, not the zygote
        null = os.open(os.devnull, os.O_RDONLY)  # the command pipe is the zygote's alone
        os.dup2(null, 0)
        os.chdir(cmd["folder"])
        mb = 2**20
        cpu = int(cmd["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(cmd["file_mb"]) * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if cmd.get("data_mb"):
            resource.setrlimit(resource.RLIMIT_DATA, (int(cmd["data_mb"]) * mb,) * 2)
        if cmd.get("procs"):  # inside the sandbox's namespace: its processes and threads
            resource.setrlimit(resource.RLIMIT_NPROC, (int(cmd["procs"]),) * 2)
        os.environ.update({str(k): str(v) for k, v in cmd.get("env", {}).items()})
        argv = [str(a) for a in cmd["argv"]]
        if argv[:1] == ["-m"]:
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[:1] == ["-c"]:
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            raise ValueError(f"the zygote runs '-m module' or '-c code', not {argv[:1]}")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except MemoryError:
        code = 3  # desktop.task_runner's EXIT_OOM
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _sweep() -> None:
    """Kill every process of this pid namespace but this one and its init, and empty the
    private /tmp and /dev/shm. Only ever inside bubblewrap: kill(-1) outside a namespace of
    its own would reach every process of the user, so the sandbox's init must be bwrap."""
    try:
        with open("/proc/1/comm", encoding="utf-8") as f:
            if f.read().strip() != "bwrap":
                return
    except OSError:
        return
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(-1, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    for tmp in ("/tmp", "/dev/shm"):
        with contextlib.suppress(OSError):
            _clear(tmp, os.stat(tmp).st_dev)


def _clear(folder: str, dev: int) -> None:
    """Empty `folder` without leaving its file system: the zygote's own folder is bound in
    under /tmp when the tasks live there, and must not go."""
    import contextlib

    with os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_dev != dev:
                    continue  # a mount point: a bound folder, not the task's leftovers
                if entry.is_dir(follow_symlinks=False):
                    _clear(entry.path, dev)
                    os.rmdir(entry.path)  # fails, and stays, where it holds a mount point
                else:
                    os.unlink(entry.path)


def main() -> int:
    import gc
    import importlib

    for name in WARM_IMPORTS:
        importlib.import_module(name)
    gc.collect()
    _say(READY)
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            if not isinstance(cmd, dict) or "folder" not in cmd or "argv" not in cmd:
                raise ValueError("a command needs 'folder' and 'argv'")
        except ValueError as exc:
            _say({"zygote": "error", "detail": str(exc)[:300]})
            continue
        _import_on_demand(cmd.get("imports"))
        sys.stdout.flush()
        sys.stderr.flush()
        # the collector leaves what is here now alone: a child's collections would otherwise
        # write to every object the zygote imported and copy their pages (some 70 MB a task)
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            _child(cmd)
        _, wait_status = os.waitpid(pid, 0)
        if cmd.get("sweep"):
            _sweep()
        _say({"zygote": "exited", "code": _status(wait_status)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
