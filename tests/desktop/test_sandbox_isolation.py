"""The sandbox: no network, nothing writable outside the task folder, limits enforced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.sandbox import Limits, Sandbox, bwrap_argv, bwrap_usable
from desktop.warm import WARM_SLOT
from tests.desktop.sandboxed import PY, run

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap missing or unusable")


pytestmark = pytest.mark.usefixtures("task_start")  # cold and warm, every test


@needs_bwrap
def test_a_task_cannot_open_a_socket(tmp_path: Path) -> None:
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "s.settimeout(2)\n"
        "s.connect(('1.1.1.1', 80))\n"
    )
    result = run(tmp_path / "task", code)
    assert result.status == "crashed"
    assert "Network is unreachable" in result.stderr_tail
    # the same code outside the sandbox gets past socket creation: the test can fail
    assert result.isolated


@needs_bwrap
def test_a_task_cannot_reach_the_agents_loopback(tmp_path: Path) -> None:
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        result = run(
            tmp_path / "task", f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"
        )
    finally:
        server.close()
    assert result.status == "crashed"
    assert "ConnectionRefused" in result.stderr_tail or "unreachable" in result.stderr_tail


@needs_bwrap
def test_a_task_can_write_only_its_own_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    project_file = Path(__file__).resolve().parents[2] / "sandbox-escape.txt"
    targets = [str(outside), str(project_file), "/root/escape.txt", "/usr/escape.txt"]
    code = (
        "import json, pathlib\n"
        "pathlib.Path('inside.txt').write_text('ok')\n"
        "report = {}\n"
        f"for target in {targets!r}:\n"
        "    try:\n"
        "        open(target, 'w').write('escaped')\n"
        "        report[target] = 'WROTE'\n"
        "    except OSError as e:\n"
        "        report[target] = 'DENIED'\n"
        "pathlib.Path('report.json').write_text(json.dumps(report))\n"
    )
    folder = tmp_path / "task"
    result = run(folder, code)
    assert result.status == "ok", result.detail
    assert (folder / "inside.txt").read_text() == "ok"
    report = json.loads((folder / "report.json").read_text())
    # /tmp inside is a private, throw-away tmpfs: a write there never reaches the host's /tmp
    # (nor the project's folder, when the project itself lives under /tmp as a CI clone does:
    # only its code packages are bound, read-only, into that tmpfs)
    in_tmp = {str(outside)} | (
        {str(project_file)} if project_file.is_relative_to("/tmp") else set()
    )
    assert {t: v for t, v in report.items() if t not in in_tmp} == {
        t: "DENIED" for t in targets[1:] if t not in in_tmp
    }
    assert not outside.exists() and not project_file.exists()
    code_file = Path(__file__).resolve().parents[2] / "desktop" / "sandbox-escape.txt"
    result = run(folder, f"open({str(code_file)!r}, 'w').write('escaped')")
    assert result.status == "crashed" and "Read-only file system" in result.stderr_tail
    assert not code_file.exists()


def test_over_memory_is_killed_and_reported(tmp_path: Path) -> None:
    result = run(tmp_path / "task", "b = bytearray(3 * 2**30)", memory_mb=256)
    assert result.status == "oom", (result.status, result.detail, result.stderr_tail)


def test_over_time_is_killed_and_reported(tmp_path: Path) -> None:
    result = run(tmp_path / "task", "import time\nwhile True: time.sleep(0.05)", wall_s=0.5)
    assert result.status == "timeout"
    assert "time limit" in result.detail


def test_over_cpu_time_is_killed_and_reported(tmp_path: Path) -> None:
    result = run(tmp_path / "task", "while True: pass", cpu_s=1)
    assert result.status == "timeout", (result.status, result.detail)


def test_cancel_stops_the_task(tmp_path: Path) -> None:
    with Sandbox(Limits(wall_s=60)) as sandbox:
        result = sandbox.run(
            tmp_path / "task",
            [PY, "-c", "import time; time.sleep(60)"],
            should_stop=lambda: "paused",
        )
    # asked to pause first (it cannot: it is no task runner), then stopped all the same
    assert result.status == "cancelled" and result.detail.startswith("paused; it did not pause")


def test_without_bwrap_limits_still_apply_and_a_warning_is_given(tmp_path: Path) -> None:
    warnings: list[str] = []
    with Sandbox(Limits(wall_s=60, memory_mb=256), use_bwrap=False, warn=warnings.append) as sb:
        assert warnings and "bubblewrap" in warnings[0]
        result = sb.run(tmp_path / "task", [PY, "-c", "b = bytearray(3 * 2**30)"])
    assert result.status == "oom" and not result.isolated


def test_progress_events_come_back(tmp_path: Path) -> None:
    seen: list[dict] = []
    code = "import json\nfor i in range(3): print(json.dumps({'progress': i / 2}), flush=True)"
    with Sandbox(Limits(wall_s=60)) as sandbox:
        result = sandbox.run(tmp_path / "t", [PY, "-c", code], on_event=seen.append)
    assert result.ok and [e["progress"] for e in seen] == [0.0, 0.5, 1.0]


def test_gpu_tasks_get_only_gpu_device_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not bwrap_usable():
        pytest.skip("bubblewrap missing")
    import desktop.sandbox as sb

    monkeypatch.setattr(sb, "gpu_device_nodes", lambda: ["/dev/nvidia0", "/dev/nvidiactl"])
    argv = bwrap_argv(tmp_path, [PY, "-V"], gpu=True)
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind"]
    assert binds == ["/dev/nvidia0", "/dev/nvidiactl"]
    # every namespace, or (a root agent: no user namespace, see bwrap_argv) all but that one
    assert "--unshare-all" in argv or {"--unshare-net", "--unshare-pid"} <= set(argv)
    assert bwrap_argv(tmp_path, [PY, "-V"], gpu=False).count("--dev-bind") == 0


@needs_bwrap
def test_packages_on_any_sys_path_entry_are_seen_and_neighbours_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package reached through PYTHONPATH or a layered environment (not under sys.prefix)
    imports inside the task, as torch must on CUDA images; the agent's working directory and
    the folder holding every task stay out of sight."""
    extra = tmp_path / "layered-site"
    (extra / "layeredpkg").mkdir(parents=True)
    (extra / "layeredpkg" / "__init__.py").write_text("VALUE = 42\n")
    tasks = tmp_path / "tasks"
    (tasks / "neighbour").mkdir(parents=True)
    (tasks / "neighbour" / "secret.txt").write_text("another task's data")
    monkeypatch.syspath_prepend(str(extra))
    monkeypatch.syspath_prepend(str(tmp_path))  # an ancestor of the task folder
    monkeypatch.setenv("PYTHONPATH", str(extra))
    monkeypatch.chdir(tasks)
    code = (
        "import json, os, pathlib, layeredpkg\n"
        f"seen = os.path.exists({str(tasks / 'neighbour' / 'secret.txt')!r})\n"
        "pathlib.Path('out.json').write_text(json.dumps([layeredpkg.VALUE, seen]))\n"
    )
    folder = tasks / "mine"
    result = run(folder, code)
    assert result.status == "ok", (result.detail, result.stderr_tail)
    assert json.loads((folder / "out.json").read_text()) == [42, False]


@needs_bwrap
def test_warm_tasks_share_no_memory_no_folder_and_survive_a_kill(tmp_path: Path) -> None:
    """One warm worker, three tasks in a row: a module global set by the first is not seen by
    the second, the first's folder is out of sight, and a task killed for time leaves a
    worker that runs the next one."""
    tasks = tmp_path / "tasks"
    leak = (
        "import json, os, pathlib, desktop.task_runner as m\n"
        "seen = getattr(m, 'LEAK', None)\n"
        "m.LEAK = os.getcwd()\n"
        "others = sorted(p.name for p in pathlib.Path('..').iterdir())\n"
        "pathlib.Path('out.json').write_text(json.dumps([seen, others]))\n"
    )
    with Sandbox(Limits(wall_s=60, memory_mb=1024), warm=True) as sandbox:
        assert sandbox.run(tasks / "a", [PY, "-c", leak]).ok
        (tasks / "a" / "secret.txt").write_text("a's data")  # a stays on disk, beside b
        assert sandbox.run(tasks / "b", [PY, "-c", leak]).ok
        worker = sandbox._worker
        sandbox.limits = Limits(wall_s=0.5, memory_mb=1024)
        slow = sandbox.run(tasks / "c", [PY, "-c", "import time; time.sleep(60)"])
        sandbox.limits = Limits(wall_s=60, memory_mb=1024)
        assert sandbox.run(tasks / "d", [PY, "-c", leak]).ok
        assert sandbox._worker is worker and worker.alive()  # the same zygote all along
    assert slow.status == "timeout"
    for name in ("a", "b", "d"):
        seen, others = json.loads((tasks / name / "out.json").read_text())
        # beside it only the worker's one folder (WARM_SLOT), where its own files were
        assert seen is None and others == [WARM_SLOT]
    assert list((tasks / ".warm" / WARM_SLOT).iterdir()) == []  # each went back to its folder
    assert (tasks / "a" / "secret.txt").exists() and not (tasks / "b" / "secret.txt").exists()


def test_the_isolation_a_node_advertises_says_what_its_sandbox_gives(monkeypatch) -> None:
    """`gpuflex-node info` and registration's `hardware.isolation` (a job may require full)."""
    from desktop import sandbox

    monkeypatch.setattr(sandbox, "bwrap_usable", lambda: True)
    assert sandbox.isolation()[0] == "full"
    monkeypatch.setattr(sandbox, "bwrap_usable", lambda: False)
    level, how = sandbox.isolation()
    assert level == "limits" and "bubblewrap is missing" in how
    monkeypatch.setattr(sandbox.sys, "platform", "win32")
    level, how = sandbox.isolation()
    assert level == "limits" and "does not isolate the network or the file system" in how
