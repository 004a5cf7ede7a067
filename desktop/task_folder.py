"""Opening a task's folder by file descriptor, never through a path a task could replace.

A task writes inside its folder as it likes, so the agent reaches the folder itself through an
opened descriptor: O_DIRECTORY | O_NOFOLLOW (a symlink in its place is refused, never
followed), owned by the agent or by the sandbox's user (a folder of anyone else's is not a task
folder), and everything in it by name relative to that descriptor (`dir_fd=`). The sandbox
binds that very descriptor (bwrap's `--bind-fd`) and hands it to the task with fchown, so what
was checked is what the task gets, on its first run and on every retry.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

# who a task is when the agent runs as root: "nobody", with no capability (desktop.sandbox)
SANDBOX_UID = SANDBOX_GID = 65534

# where the OS can open a folder relative to nothing but a descriptor (not Windows)
BY_FD = os.open in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW")


class UnsafeFolder(OSError):
    """The path names no folder of the agent's (a symlink, a file, someone else's folder)."""


def plain(folder: Path) -> Path:
    """`folder` with the folders leading to it resolved (the agent's own) but not its last
    part: a symlink put in a task folder's place stays a symlink, to be refused."""
    return folder.parent.resolve() / folder.name


def open_folder(folder: Path, create: bool = False) -> int:
    """An O_DIRECTORY | O_NOFOLLOW descriptor of the task folder `folder`, checked: a real
    folder (not a symlink to one), owned by the agent or the sandbox's user. The caller
    closes it. UnsafeFolder says what is wrong; FileNotFoundError when it is not there."""
    if create:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755)
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(folder, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        raise UnsafeFolder(f"the task folder {folder.name} is not a plain folder "
                           "(a symlink?): refused") from exc  # fmt: skip
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeFolder(f"the task folder {folder.name} is not a plain folder: refused")
        if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), SANDBOX_UID):
            raise UnsafeFolder(
                f"the task folder {folder.name} belongs to uid {st.st_uid}, neither the agent "
                "nor the sandbox: refused"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd
