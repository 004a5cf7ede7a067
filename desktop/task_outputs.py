"""Reading what a sandboxed task left in its folder, without trusting it.

A task writes its folder as it likes: an output may be a symlink to a file of the agent's (its
API key), a FIFO that blocks an open, a directory, or bytes that are not what they claim. So the
agent opens each output with O_NOFOLLOW (a symlink is refused, never followed) and O_NONBLOCK (a
FIFO cannot hang it), accepts a regular file only (fstat on the opened descriptor, so nothing can
be swapped in between a check and the open), reads at most a cap, and copies onward from that
descriptor, never by the task-controlled path. Errors name the file and what is wrong with it;
they never quote its bytes, since error reports go to the server. The folder itself is opened
the same way (desktop.task_folder: O_DIRECTORY | O_NOFOLLOW, the agent's or the sandbox's), and
the output by name relative to it, so a task that put a symlink in its folder's place reaches
nothing through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from desktop.task_folder import BY_FD, UnsafeFolder, open_folder

JSON_MAX_BYTES = 1 << 20  # result.json and friends: small by construction
UPDATE_MAX_BYTES = 8 << 30


class UnsafeOutput(OSError):
    """A task output the agent will not use; the message never holds the file's bytes."""


def _open(folder: Path, name: str) -> int:
    if not name or "/" in name or name in (".", ".."):
        raise UnsafeOutput(f"{name!r} is not a plain file name")
    with _folder(folder) as dir_fd:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(name if BY_FD else folder / name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            raise UnsafeOutput(f"the task wrote no {name}") from None
        except OSError as exc:  # ELOOP: the last component is a symlink
            raise UnsafeOutput(f"{name} is not a regular file (a symlink?): refused") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeOutput(f"{name} is not a regular file: refused")
    return fd


@contextlib.contextmanager
def _folder(folder: Path) -> Iterator[int | None]:
    """The task folder, opened (desktop.task_folder), where the OS opens by descriptor."""
    if not BY_FD:
        yield None
        return
    try:
        fd = open_folder(folder)
    except FileNotFoundError:
        raise UnsafeOutput(f"the task folder {folder.name} is gone") from None
    except UnsafeFolder as exc:
        raise UnsafeOutput(str(exc)) from exc
    try:
        yield fd
    finally:
        os.close(fd)


def is_regular(folder: Path, name: str) -> bool:
    """`name` exists in `folder` as a regular file (not through a symlink)."""
    try:
        os.close(_open(folder, name))
    except UnsafeOutput:
        return False
    return True


def read_output(folder: Path, name: str, max_bytes: int = UPDATE_MAX_BYTES) -> bytes:
    """The bytes of the regular file `folder/name`; UnsafeOutput for anything else."""
    fd = _open(folder, name)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeOutput(f"{name} is larger than {max_bytes} bytes: refused")
    return data


def read_json_output(folder: Path, name: str) -> dict[str, Any]:
    """A task's JSON object output; the error says what is wrong, never what the file holds."""
    data = read_output(folder, name, JSON_MAX_BYTES)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UnsafeOutput(f"{name} is not valid UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise UnsafeOutput(f"{name} is not a JSON object")
    return value


def numeric_metrics(outcome: dict[str, Any]) -> dict[str, float]:
    """result.json's `metrics` as floats keyed by short names."""
    raw = outcome.get("metrics", {})
    if not isinstance(raw, dict):
        raise UnsafeOutput("result.json's metrics are not an object")
    metrics: dict[str, float] = {}
    for key, value in raw.items():
        if not isinstance(value, int | float):  # float() of a string would quote it on error
            raise UnsafeOutput("result.json has a metric that is not a number")
        if len(key) > 64:
            raise UnsafeOutput("result.json has a metric name over 64 characters")
        metrics[key] = float(value)
    return metrics


def copy_output(folder: Path, name: str, target: Path) -> None:
    """Copy the regular file `folder/name` to `target` from the opened descriptor, through a
    temporary file beside `target`, so `target` is whole or absent, and never a symlink."""
    fd = _open(folder, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    out, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "rb") as src, os.fdopen(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def opened_output(folder: Path, name: str) -> Iterator[Path]:
    """A path to the regular file `folder/name` as opened now: /proc/self/fd/N on Linux, so
    whoever copies from it (the input cache) copies that file whatever the task's path names
    later; elsewhere (no task sandbox to race with) the path itself, once checked."""
    fd = _open(folder, name)
    try:
        proc = Path(f"/proc/self/fd/{fd}")
        yield proc if proc.exists() else folder / name
    finally:
        os.close(fd)


def link_or_copy_output(folder: Path, name: str, target: Path) -> None:
    """A second name for a regular file of a task folder (no copy of a large shard) or, where
    links fail, a copy from the opened file; a symlink is refused, never linked or followed."""
    with opened_output(folder, name), _folder(folder) as dir_fd:  # a regular file only
        try:
            os.link(name if BY_FD else folder / name, target, src_dir_fd=dir_fd,
                    follow_symlinks=False)  # fmt: skip
            return
        except OSError:
            pass
    copy_output(folder, name, target)
