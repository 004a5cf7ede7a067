"""The macOS sandbox's Seatbelt profile (desktop/seatbelt.py): checked as text here, run for
real only on macOS (`-m macos`; this project's CI has no Mac)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from desktop.seatbelt import SANDBOX_EXEC, profile, quote, seatbelt_argv


def test_the_profile_denies_by_default_and_the_network_always(tmp_path: Path) -> None:
    text = profile(tmp_path / "task", python=[Path("/opt/py")])
    lines = text.splitlines()
    assert lines[:3] == ["(version 1)", "(deny default)", "(deny network*)"]
    assert not any(line.startswith("(allow network") for line in lines)


def test_only_the_task_folder_is_writable(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    writes = [line for line in profile(folder).splitlines() if "file-write" in line]
    assert writes == [f"(allow file-read* file-write* (subpath {quote(folder)}))",
                      '(allow file-write* (literal "/dev/null"))']  # fmt: skip


def test_the_owners_home_is_not_readable(tmp_path: Path) -> None:
    reads = [line for line in profile(tmp_path / "t", python=[Path("/opt/py")]).splitlines()
             if "file-read*" in line]  # fmt: skip
    assert not any('"/Users' in line or '(subpath "/")' in line for line in reads)
    assert '(allow file-read* (subpath "/opt/py"))' in reads  # its own Python


def test_paths_are_quoted_and_control_characters_refused() -> None:
    assert quote('/tmp/a "b"\\c') == '"/tmp/a \\"b\\"\\\\c"'
    with pytest.raises(ValueError, match="control characters"):
        quote("/tmp/a\n(allow network*)")


def test_the_command_runs_the_task_under_sandbox_exec(tmp_path: Path) -> None:
    argv = seatbelt_argv(tmp_path, [sys.executable, "-c", "pass"])
    assert argv[:2] == [SANDBOX_EXEC, "-p"] and argv[3:] == [sys.executable, "-c", "pass"]
    assert f"(subpath {quote(Path(sys.prefix).resolve())})" in argv[2]


@pytest.mark.macos
@pytest.mark.skipif(sys.platform != "darwin", reason="sandbox-exec is macOS's")
def test_live_a_confined_task_writes_its_folder_only_and_has_no_network(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    folder.mkdir()
    outside = tmp_path / "outside.txt"
    code = (
        "import pathlib, socket\n"
        "pathlib.Path('inside.txt').write_text('ok')\n"
        f"try:\n    pathlib.Path({str(outside)!r}).write_text('escaped')\n"
        "except OSError:\n    pass\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    print('NET')\n"
        "except OSError:\n    print('NONET')\n"
    )
    done = subprocess.run(seatbelt_argv(folder, [sys.executable, "-c", code]), cwd=folder,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (folder / "inside.txt").read_text() == "ok"
    assert not outside.exists()
    assert "NONET" in done.stdout, (done.stdout, done.stderr)
