"""Escape attempts a hostile task makes, run for real through bubblewrap (#20, finding 4).

Each test is what an attacker's task did: read the agent's secrets through /proc, use the
capabilities a root agent left it, fork without end, fill /dev/shm or its folder, and leave
symlinks for the agent to follow. The caps are tiny, set by each test, so they stay cheap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.sandbox import Limits, Sandbox, bwrap_usable
from tests.desktop.sandboxed import PY, run, run_reporting

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap missing or unusable")
pytestmark = needs_bwrap

SECRET = "gfx_n_SECRET-MARKER-7f3a9c"


def test_no_agent_secret_in_any_environ_a_task_can_read(
    tmp_path: Path, task_start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEX_API_KEY", SECRET)
    code = (
        "import os\n"
        "seen = {}\n"
        "for pid in ['self', '1', str(os.getppid())] + os.listdir('/proc'):\n"
        "    try:\n"
        "        seen[pid] = open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1')\n"
        "    except OSError as e:\n"
        "        seen[pid] = 'DENIED'\n"
        "report(seen)\n"
    )
    seen = run_reporting(tmp_path / "task", code)
    assert "1" in seen and "self" in seen
    assert not [pid for pid, env in seen.items() if SECRET in env], seen


def test_a_task_has_no_capability_and_is_not_root(tmp_path: Path, task_start: str) -> None:
    code = (
        "import os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
        "report({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(),\n"
        "        'CapEff': status['CapEff'].strip(), 'CapPrm': status['CapPrm'].strip()})\n"
    )
    seen = run_reporting(tmp_path / "task", code)
    assert seen["uid"] != 0 and seen["euid"] != 0 and seen["gid"] != 0, seen
    assert int(seen["CapEff"], 16) == 0 and int(seen["CapPrm"], 16) == 0, seen


def test_a_task_cannot_remount_write_the_host_or_ptrace_init(tmp_path: Path) -> None:
    project_code = Path(__file__).resolve().parents[2] / "desktop"
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = {}\n"
        "MS_REMOUNT, MS_BIND = 32, 4096\n"
        f"for target in [{str(project_code)!r}, '/']:\n"
        "    rc = libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND, None)\n"
        "    r['remount ' + target] = 'DONE' if rc == 0 else 'DENIED'\n"
        f"for target in [{str(project_code / 'escape.txt')!r}, '/usr/escape.txt',\n"
        "               '/escape.txt', '/proc/sys/kernel/hostname']:\n"
        "    try:\n"
        "        open(target, 'w').write('escaped')\n"
        "        r['write ' + target] = 'DONE'\n"
        "    except OSError:\n"
        "        r['write ' + target] = 'DENIED'\n"
        "rc = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH the sandbox's init\n"
        "r['ptrace 1'] = 'DONE' if rc == 0 else 'DENIED'\n"
        "report(r)\n"
    )
    seen = run_reporting(tmp_path / "task", code)
    assert set(seen.values()) == {"DENIED"}, seen
    assert not (project_code / "escape.txt").exists()


def test_a_fork_bomb_hits_the_process_limit(tmp_path: Path, task_start: str) -> None:
    code = (
        "import os, time\n"
        "for _ in range(200):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
    )
    # memory to spare: the watchdog sums the children's resident sets, and forks of the warm
    # worker each count the torch it shares
    result = run(tmp_path / "task", code, procs=24, memory_mb=8192)
    assert result.status == "crashed", (result.status, result.detail, result.stderr_tail)
    assert "process limit of 24" in result.detail


def test_dev_shm_and_tmp_are_capped_and_counted_in_memory(tmp_path: Path) -> None:
    code = (
        "r = {}\n"
        "for place in ['/dev/shm', '/tmp']:\n"
        "    try:\n"
        "        with open(place + '/fill', 'wb') as f:\n"
        "            for _ in range(32):\n"
        "                f.write(b'x' * 2**20)\n"
        "        r[place] = 'WROTE 32 MB'\n"
        "    except OSError as e:\n"
        "        r[place] = 'FULL' if e.errno == 28 else str(e)\n"
        "report(r)\n"
    )
    seen = run_reporting(tmp_path / "task", code, tmpfs_mb=8)
    assert seen == {"/dev/shm": "FULL", "/tmp": "FULL"}
    limits = Limits(memory_mb=1024, tmpfs_mb=8)
    assert limits.resident_mb == 1024 - 16  # the watchdog leaves room for both tmpfs
    assert Limits(memory_mb=256).tmpfs_size_mb == 32  # at most an eighth of the memory


def test_writing_past_the_folder_quota_fails_the_task(tmp_path: Path, task_start: str) -> None:
    code = (
        "import time\n"
        "with open('fill', 'wb') as f:\n"
        "    for _ in range(12):\n"
        "        f.write(b'x' * 2**20)\n"
        "        f.flush()\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    result = run(tmp_path / "task", code, folder_mb=4)
    assert result.status == "quota", (result.status, result.detail)
    assert "over its quota of 4 MB" in result.detail


def test_a_symlinked_result_is_refused_without_quoting_the_target(tmp_path: Path) -> None:
    """result.json pointing at a file outside the folder: refused, and none of its bytes
    reach the detail the agent reports to the server."""
    secret = tmp_path / "credentials.json"
    secret.write_text(json.dumps({"status": "failed", "reason": "oom", "detail": SECRET}))
    folder = tmp_path / "task"
    code = (
        "import os\n"
        f"os.symlink({str(secret)!r}, 'result.json')\n"
        f"os.symlink({str(secret)!r}, 'update.safetensors')\n"
    )
    with Sandbox(Limits(wall_s=60, memory_mb=1024)) as sandbox:
        result = sandbox.run(folder, [PY, "-c", code])
        assert result.status == "ok", (result.detail, result.stderr_tail)
        verdict = sandbox._read_result(folder, result)
    assert verdict.status == "crashed"
    assert "result.json" in verdict.detail and "symlink" in verdict.detail
    assert SECRET not in verdict.detail and "oom" not in verdict.status


def test_symlinked_outputs_are_refused_and_never_copied_onward(tmp_path: Path) -> None:
    """What the agent does with an update and a residual a task symlinked to its key file."""
    from desktop.task_outputs import (
        UnsafeOutput,
        copy_output,
        link_or_copy_output,
        numeric_metrics,
        read_json_output,
        read_output,
    )

    secret = tmp_path / "credentials"
    secret.write_text(SECRET)
    folder = tmp_path / "task"
    folder.mkdir()
    for name in ("update.safetensors", "residual.next.safetensors", "result.json"):
        (folder / name).symlink_to(secret)
    nxt = tmp_path / "next-task"
    nxt.mkdir()
    for call in (
        lambda: read_output(folder, "update.safetensors"),
        lambda: read_json_output(folder, "result.json"),
        lambda: copy_output(folder, "residual.next.safetensors", nxt / "residual.safetensors"),
        lambda: link_or_copy_output(folder, "update.safetensors", nxt / "update.safetensors"),
    ):
        with pytest.raises(UnsafeOutput) as caught:
            call()
        assert "symlink" in str(caught.value) and SECRET not in str(caught.value)
    assert list(nxt.iterdir()) == []  # nothing carried into the next task's folder
    (folder / "result.json").unlink()
    (folder / "result.json").write_text(json.dumps({"metrics": {"loss": SECRET}}))
    with pytest.raises(UnsafeOutput) as caught:  # float() would have quoted the value
        numeric_metrics(read_json_output(folder, "result.json"))
    assert SECRET not in str(caught.value)
    (folder / "real").write_bytes(b"weights")
    copy_output(folder, "real", nxt / "copied")
    assert (nxt / "copied").read_bytes() == b"weights" and not (nxt / "copied").is_symlink()
