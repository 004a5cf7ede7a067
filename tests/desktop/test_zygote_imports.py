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
