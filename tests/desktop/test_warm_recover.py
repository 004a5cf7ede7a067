"""The warm worker's folder after a crash, and as an older agent left it (#38, finding 1-2).

A crash mid-task leaves the task's files in `.warm/task/`, with `.warm/owner` naming their
folder: they go back there. An older agent's `.warm/` was the tasks' to write: whatever a task
left there (a file past its quota, a symlink to a host folder) goes, nothing is followed, and
the folder becomes the agent's alone again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from desktop.task_folder import SANDBOX_UID
from desktop.warm import OWNER, WARM_DIR, WARM_SLOT, WarmWorker, recover

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm: Linux")


def test_a_crashed_tasks_files_go_back_to_its_folder(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    slot = tasks / WARM_DIR / WARM_SLOT
    slot.mkdir(parents=True)
    (tasks / "t1").mkdir()
    (slot / "update.safetensors").write_bytes(b"weights")
    (slot / "sub").mkdir()
    (slot / "sub" / "x").write_text("x")
    (tasks / WARM_DIR / OWNER).write_text("t1")
    recover(tasks)
    assert (tasks / "t1" / "update.safetensors").read_bytes() == b"weights"
    assert (tasks / "t1" / "sub" / "x").read_text() == "x"
    assert list(slot.iterdir()) == [] and not (tasks / WARM_DIR / OWNER).exists()


def test_an_older_warm_folder_is_cleaned_and_taken_back(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "keep").write_text("host data")
    tasks = tmp_path / "tasks"
    warm = tasks / WARM_DIR
    (warm / "old-task").mkdir(parents=True)  # an older agent's crash: a folder moved in whole
    (warm / "old-task" / "task.json").write_text("{}")
    (warm / "outside.bin").write_bytes(b"x" * 4096)  # a task's, past its quota
    (warm / "t2").symlink_to(host)  # a task's folder, swapped for a symlink
    (warm / "evil").symlink_to(host / "keep")
    if os.geteuid() == 0:
        os.chown(warm, SANDBOX_UID, SANDBOX_UID)  # what an older root agent did
    warm.chmod(0o777)
    recover(tasks)
    assert (tasks / "old-task" / "task.json").read_text() == "{}"
    assert sorted(os.listdir(warm)) == []
    assert not os.path.lexists(tasks / "t2") and not os.path.lexists(tasks / "evil")
    assert (host / "keep").read_text() == "host data"
    worker = WarmWorker(warm / WARM_SLOT, lambda *a: None)  # type: ignore[arg-type,return-value]
    worker._open_folders()
    try:
        st = warm.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o755)
        assert (warm / WARM_SLOT).is_dir() and not (warm / WARM_SLOT).is_symlink()
    finally:
        worker._close_folders()


def test_files_whose_folder_became_a_symlink_are_dropped_not_followed(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    tasks = tmp_path / "tasks"
    slot = tasks / WARM_DIR / WARM_SLOT
    slot.mkdir(parents=True)
    (tasks / "t3").symlink_to(host)
    (slot / "update.safetensors").write_bytes(b"weights")
    (tasks / WARM_DIR / OWNER).write_text("t3")
    recover(tasks)
    assert list(host.iterdir()) == [] and list(slot.iterdir()) == []


def test_a_symlink_in_place_of_the_slot_is_replaced_by_a_folder(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    warm = tmp_path / "tasks" / WARM_DIR
    warm.mkdir(parents=True)
    (warm / WARM_SLOT).symlink_to(host)
    worker = WarmWorker(warm / WARM_SLOT, lambda *a: None)  # type: ignore[arg-type,return-value]
    worker._open_folders()
    try:
        assert (warm / WARM_SLOT).is_dir() and not (warm / WARM_SLOT).is_symlink()
        assert host.is_dir()  # untouched
    finally:
        worker._close_folders()
