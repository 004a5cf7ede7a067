"""A hostile task against its own folder and the kernel, through bubblewrap, cold and warm
(#38, findings 1-3).

1. A task renames its folder and leaves a symlink to a host folder in its place: the agent
   must neither read the task's outputs through it nor, on a retry, hand that folder to the
   task.
2. A task writes beside its folder (`../outside.bin`): nothing it writes may land outside its
   own quota'd folder, nor be seen by the next task.
3. A task makes a user namespace (and, with it, mounts of its own): refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from desktop.sandbox import Limits, Sandbox, bwrap_usable
from tests.desktop.sandboxed import PY, REPORT, run_reporting

pytestmark = [
    pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap missing or unusable"),
    pytest.mark.usefixtures("task_start"),  # cold and warm, every test
]

OTHER_JOB = "another job's update bytes"


def _host_folder(tmp_path: Path) -> Path:
    """A folder of the host's that no task may reach: root's (the agent's) own, 0755, with
    what looks like another task's outputs in it."""
    host = tmp_path / "host-folder"
    host.mkdir(mode=0o755)
    (host / "result.json").write_text(json.dumps({"status": "ok", "detail": OTHER_JOB}))
    (host / "update.safetensors").write_text(OTHER_JOB)
    return host


def test_a_task_cannot_swap_its_folder_for_a_symlink_to_the_host(tmp_path: Path) -> None:
    host = _host_folder(tmp_path)
    owner = host.stat().st_uid
    folder = tmp_path / "tasks" / "t1"
    swap = (
        "import os\n"
        "here = os.getcwd()\n"
        "try:\n"
        "    os.rename(here, here + '.gone')\n"
        f"    os.symlink({str(host)!r}, here)\n"
        "    os.chdir(here + '.gone')\n"
        "    done = 'RENAMED'\n"
        "except OSError as e:\n"
        "    done = 'DENIED'\n"
        "report({'rename': done})\n"
    )
    with Sandbox(Limits(wall_s=60, memory_mb=1024)) as sandbox:
        result = sandbox.run(folder, [PY, "-c", REPORT + swap])
        assert result.status == "ok", (result.detail, result.stderr_tail)
        assert not folder.is_symlink() and folder.is_dir()
        assert json.loads((folder / "report.json").read_text()) == {"rename": "DENIED"}
        # the agent's read of the task's verdict and update: the task's own folder, or nothing
        verdict = sandbox._read_result(folder, result)
        assert OTHER_JOB not in verdict.detail
        # the retry (after a pause, a cancel) runs in the task's folder, never the host's
        again = sandbox.run(folder, [PY, "-c", "open('retried', 'w').write('x')"])
        assert again.status == "ok", (again.detail, again.stderr_tail)
    assert (folder / "retried").exists()
    assert not (host / "retried").exists() and host.stat().st_uid == owner


def test_a_symlink_in_place_of_the_folder_is_refused_on_a_retry(tmp_path: Path) -> None:
    """Whatever put it there: the agent neither follows it nor hands its target to a task."""
    from desktop.task_outputs import UnsafeOutput, read_json_output, read_output

    host = _host_folder(tmp_path)
    owner, mode = host.stat().st_uid, host.stat().st_mode
    folder = tmp_path / "tasks" / "t1"
    folder.parent.mkdir()
    folder.symlink_to(host)
    for read in (read_output, read_json_output):
        with pytest.raises(UnsafeOutput) as caught:
            read(folder, "update.safetensors" if read is read_output else "result.json")
        assert OTHER_JOB not in str(caught.value)
    with Sandbox(Limits(wall_s=60, memory_mb=1024)) as sandbox:
        again = sandbox.run(folder, [PY, "-c", "open('retried', 'w').write('x')"])
    assert again.status == "sandbox" and "not a plain folder" in again.detail
    assert not (host / "retried").exists()
    assert (host.stat().st_uid, host.stat().st_mode) == (owner, mode)
    assert not (tmp_path / "tasks" / ".warm" / "retried").exists()


def test_a_task_writes_nothing_outside_its_folder(tmp_path: Path) -> None:
    """`../outside.bin` is refused (it would be past the folder's quota and seen by the next
    task, of another job); the next task sees none of it."""
    tasks = tmp_path / "tasks"
    write = (
        "import os\n"
        "r = {}\n"
        "for target in ['../outside.bin', '../../outside.bin', os.environ['HOME'] + '/../x']:\n"
        "    try:\n"
        "        with open(target, 'wb') as f:\n"
        "            f.write(b'x' * 2**20)\n"
        "        r[target] = 'WROTE'\n"
        "    except OSError:\n"
        "        r[target] = 'DENIED'\n"
        "try:\n"
        "    os.mkdir('../outside-dir')\n"
        "    r['mkdir'] = 'MADE'\n"
        "except OSError:\n"
        "    r['mkdir'] = 'DENIED'\n"
        "report(r)\n"
    )
    seen = run_reporting(tasks / "a", write, folder_mb=1)
    assert set(seen.values()) == {"DENIED"}, seen
    look = "import os\nreport(sorted(os.listdir('..')))\n"
    neighbours = run_reporting(tasks / "b", look)
    assert not [n for n in neighbours if n.startswith("outside")], neighbours
    assert len(neighbours) == 1  # its own folder, nothing else
    left = [p for p in tmp_path.rglob("outside*")]
    assert left == []
    assert sorted(os.listdir(tasks)) in (["a", "b"], [".warm", "a", "b"])


def test_a_task_cannot_make_namespaces_or_mounts(tmp_path: Path) -> None:
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000\n"
        "r = {}\n"
        "def attempt(name, call):\n"
        "    rc = call()\n"
        "    r[name] = 'DONE' if rc >= 0 else os.strerror(ctypes.get_errno())\n"
        "attempt('userns+mountns', lambda: libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))\n"
        "attempt('userns', lambda: libc.unshare(CLONE_NEWUSER))\n"
        "attempt('netns', lambda: libc.unshare(CLONE_NEWNET))\n"
        "attempt('mount tmpfs', lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, b'size=3g'))\n"
        "SYS = {'x86_64': {'fsopen': 430, 'open_tree': 428, 'setns': 308},\n"
        "       'aarch64': {'fsopen': 430, 'open_tree': 428, 'setns': 268}}[os.uname().machine]\n"
        "attempt('fsopen', lambda: libc.syscall(SYS['fsopen'], b'tmpfs', 0))\n"
        "attempt('open_tree', lambda: libc.syscall(SYS['open_tree'], -100, b'/tmp', 1))\n"
        "attempt('setns', lambda: libc.syscall(SYS['setns'], os.open('/proc/self/ns/net', 0), 0))\n"
        "if os.uname().machine == 'x86_64':  # the x32 ABI's unshare\n"
        "    attempt('x32 unshare', lambda: libc.syscall(0x40000000 | 272, CLONE_NEWUSER))\n"
        "pid = os.fork()  # what a task may still do: fork, and start threads\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "r['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "import threading\n"
        "t = threading.Thread(target=lambda: r.__setitem__('thread', 'ran'))\n"
        "t.start(); t.join()\n"
        "report(r)\n"
    )
    seen = run_reporting(tmp_path / "task", code)
    allowed = {"fork": 7, "thread": "ran"}
    assert {k: v for k, v in seen.items() if k in allowed} == allowed, seen
    made = {k: v for k, v in seen.items() if k not in allowed}
    assert made and not [k for k, v in made.items() if v == "DONE"], seen
    assert set(made.values()) == {os.strerror(1)}, seen  # EPERM: refused, not merely missing
