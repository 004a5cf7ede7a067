"""The macOS sandbox: a Seatbelt profile for `sandbox-exec`, macOS's counterpart of the
bubblewrap confinement (desktop/sandbox.py) on Linux.

The profile denies everything, then allows what a task needs: running its own Python,
reading the system and the Python installation (never the owner's home), reading and writing
only its task folder (and what the agent binds read-only for it, a federated dataset), and
no network at all. `sandbox-exec` is deprecated by Apple but still shipped and used by
Chromium and Bazel; its profile language is not documented, so the rules here stay few.

Tested here as text (tests/desktop/test_seatbelt.py); the live test runs only on macOS
(`-m macos`), which this project's CI does not have.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
# what a Python task reads besides its interpreter's prefix: the OS, its libraries, devices
SYSTEM_READ = ("/System", "/usr", "/Library", "/private/etc", "/private/var/db/timezone",
               "/dev", "/opt/homebrew")  # fmt: skip


def seatbelt_usable() -> bool:
    return sys.platform == "darwin" and shutil.which("sandbox-exec") is not None


def quote(path: Path | str) -> str:
    """A path as an SBPL string literal: backslashes and quotes escaped; a path with a
    newline or NUL cannot be written safely and is refused."""
    text = str(path)
    if "\n" in text or "\x00" in text or "\r" in text:
        raise ValueError(f"cannot confine a task to a path with control characters: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile(folder: Path, read_only: Iterable[Path] = (), python: Iterable[Path] = ()) -> str:
    """The Seatbelt profile for a task in `folder`: writes there only, reads the system, the
    Python prefixes and `read_only`, and no network."""
    reads = [*SYSTEM_READ, *(str(p) for p in python), *(str(p) for p in read_only)]
    lines = [
        "(version 1)",
        "(deny default)",
        "(deny network*)",  # said again: the one rule that must never be lost to an allow
        "(allow process-fork)",
        "(allow process-exec)",
        "(allow signal (target same-sandbox))",
        "(allow sysctl-read)",
        "(allow mach-lookup)",  # the dynamic loader and libc ask launchd for services
        "(allow ipc-posix-shm)",  # Python's multiprocessing and torch's shared memory
        "(allow file-read-metadata)",  # stat() on the path to the folder
        '(allow file-read* (literal "/"))',
        *(f"(allow file-read* (subpath {quote(p)}))" for p in reads),
        f"(allow file-read* file-write* (subpath {quote(folder)}))",
        '(allow file-write* (literal "/dev/null"))',
    ]
    return "\n".join(lines) + "\n"


def seatbelt_argv(folder: Path, argv: list[str], read_only: Iterable[Path] = ()) -> list[str]:
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    text = profile(folder.resolve(), [Path(p).resolve() for p in read_only], sorted(prefixes))
    return [SANDBOX_EXEC, "-p", text, *argv]
