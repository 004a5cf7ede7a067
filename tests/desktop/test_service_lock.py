"""One agent per data folder: the lock, and `gpuflex-node run` refusing a second instance."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from desktop.cli import main
from desktop.config import Paths
from desktop.service_lock import AlreadyRunning, InstanceLock, holder_pid


def test_a_second_lock_on_the_same_folder_is_refused(isolated_dirs: Paths) -> None:
    with InstanceLock(isolated_dirs.data) as first:
        assert holder_pid(isolated_dirs.data) is not None
        with pytest.raises(AlreadyRunning) as refused:
            InstanceLock(isolated_dirs.data).acquire()
        assert refused.value.pid == holder_pid(isolated_dirs.data)
        assert f"pid {refused.value.pid}" in str(refused.value)
        assert first.path.exists()
    InstanceLock(isolated_dirs.data).acquire().release()  # released: free again


def test_other_data_folders_are_other_agents(isolated_dirs: Paths, tmp_path) -> None:
    with InstanceLock(isolated_dirs.data), InstanceLock(tmp_path / "other"):
        pass


def test_a_second_gpuflex_node_run_names_the_running_ones_pid(isolated_dirs: Paths,
                                                              capsys) -> None:  # fmt: skip
    code = ("import sys, time; from pathlib import Path; from desktop.service_lock import "
            "InstanceLock; lock = InstanceLock(Path(sys.argv[1])).acquire(); "
            "print('held', flush=True); time.sleep(300)")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code, str(isolated_dirs.data)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["run"]) == 1
        err = capsys.readouterr().err
        assert f"already running for {isolated_dirs.data} (pid {holder.pid})" in err
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 30  # the kernel drops a dead process's lock
    while time.monotonic() < deadline:
        try:
            InstanceLock(isolated_dirs.data).acquire().release()
            break
        except AlreadyRunning:
            time.sleep(0.05)
    else:
        pytest.fail("the lock outlived its process")
