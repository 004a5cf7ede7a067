"""A task asks who it runs as: the sandbox's /etc has no passwd entry for its uid, so the
answer comes from the environment, and the caches it names live in the task's own folder.
Found on a lent H200: torch's inductor asks getpass.getuser() for its cache folder on CUDA,
and every CUDA task failed with "getpwuid(): uid not found: 65534"."""

from __future__ import annotations

from pathlib import Path

import pytest

from desktop.sandbox import TASK_USER, bwrap_usable
from tests.desktop.sandboxed import run_reporting

pytestmark = [
    pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap missing or unusable"),
    pytest.mark.usefixtures("task_start"),  # cold and warm
]


def test_a_task_without_a_passwd_entry_still_knows_its_user_and_caches_in_its_folder(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "task"
    seen = run_reporting(
        folder,
        "import getpass, os, pwd\n"
        "try:\n"
        "    pwd.getpwuid(os.getuid()); entry = True\n"
        "except KeyError:\n"
        "    entry = False\n"
        "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
        "d = cache_dir()\n"
        "open(os.path.join(d, 'probe'), 'w').write('ok')\n"
        "report({'entry': entry, 'user': getpass.getuser(), 'cache': d,\n"
        "        'cwd': os.getcwd()})\n",
        # torch's import maps per-core BLAS buffers: on a 16-core GPU machine 1 GiB of data
        # limit was too little for the import alone (OpenBLAS gave up); 4 GiB is a task's size
        memory_mb=4096,
    )
    assert seen["entry"] is False  # the condition that broke CUDA tasks holds here too
    assert seen["user"] == TASK_USER
    assert Path(seen["cache"]).is_relative_to(seen["cwd"])
    assert (folder / Path(seen["cache"]).relative_to(seen["cwd"]) / "probe").read_text() == "ok"
