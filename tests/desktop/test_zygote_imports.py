"""What the warm task worker (desktop/task_zygote.py) holds for every task, and what it leaves
to the few tasks that need it: Opacus and SciPy (some 65 MB in each contributor's zygote)
only for DP-SGD jobs, which import them as they train (tests/trainer/test_privacy.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from desktop.task_zygote import WARM_IMPORTS

PROBE = """
import importlib, json, sys
from desktop.task_zygote import WARM_IMPORTS
for name in WARM_IMPORTS:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_the_zygote_warms_torch_and_the_trainer_without_opacus_or_scipy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=300
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert {"torch", "trainer", "desktop"} <= loaded
    assert "torch._dynamo" in WARM_IMPORTS  # an optimizer's first step imports it
    assert not {"opacus", "scipy", "sklearn"} & loaded


def test_a_task_forked_from_the_zygote_leaves_the_imported_objects_to_the_zygote(
    tmp_path,
) -> None:
    """The zygote freezes what it imported before it forks: the child's collections skip
    those objects instead of writing to each (which copied some 70 MB of pages a task)."""
    zygote = subprocess.Popen(
        [sys.executable, "-m", "desktop.task_zygote"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        assert json.loads(zygote.stdout.readline()) == {"zygote": "ready"}
        code = "import gc; print('frozen', gc.get_freeze_count(), gc.isenabled(), flush=True)"
        command = {"folder": str(tmp_path), "argv": ["-c", code], "cpu_s": 60, "file_mb": 16}
        zygote.stdin.write(json.dumps(command) + "\n")
        zygote.stdin.flush()
        said, frozen, enabled = zygote.stdout.readline().split()
        assert said == "frozen" and int(frozen) > 50_000 and enabled == "True"
        assert json.loads(zygote.stdout.readline()) == {"zygote": "exited", "code": 0}
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=60)
