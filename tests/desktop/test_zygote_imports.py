"""What the warm task worker (desktop/task_zygote.py) holds for every task, and what it leaves
to the few tasks that need it: Opacus and SciPy (some 65 MB in each contributor's zygote)
only for DP-SGD jobs, imported by the zygote when their first task comes (ON_DEMAND)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from desktop.task_zygote import WARM_IMPORTS, imports_for

PROBE = """
import importlib, json, sys
from desktop.task_zygote import WARM_IMPORTS, imports_for
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


@contextmanager
def zygote() -> Iterator[subprocess.Popen]:
    """A real warm worker (no sandbox around it), ready for commands."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "desktop.task_zygote"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert json.loads(proc.stdout.readline()) == {"zygote": "ready"}
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_a_task_forked_from_the_zygote_leaves_the_imported_objects_to_the_zygote(
    tmp_path,
) -> None:
    """The zygote freezes what it imported before it forks: the child's collections skip
    those objects instead of writing to each (which copied some 70 MB of pages a task)."""
    with zygote() as worker:
        code = "import gc; print('frozen', gc.get_freeze_count(), gc.isenabled(), flush=True)"
        command = {"folder": str(tmp_path), "argv": ["-c", code], "cpu_s": 60, "file_mb": 16}
        worker.stdin.write(json.dumps(command) + "\n")
        worker.stdin.flush()
        said, frozen, enabled = worker.stdout.readline().split()
        assert said == "frozen" and int(frozen) > 50_000 and enabled == "True"
        assert json.loads(worker.stdout.readline()) == {"zygote": "exited", "code": 0}


DP_TASK = """
import json, math, sys
already = "opacus" in sys.modules
import torch
from trainer.datasets import load_dataset
from trainer.local import train_local
from trainer.models import build_model
from trainer.spec import parse_spec
spec = parse_spec({"name": "t", "local": {"steps": 4, "batch_size": 16},
                   "privacy": {"clip_norm": 0.5, "mode": "sample", "noise_multiplier": 0.5}})
data = load_dataset(spec.dataset).subset(torch.arange(200))
model = build_model(spec.model, data.input_shape, data.num_classes, seed=0)
state = {k: v.clone() for k, v in model.state_dict().items()}
result = train_local(model, state, data, spec, seed=1)
print(json.dumps({"already": already, "steps": result.steps, "finite": math.isfinite(result.loss),
                  "stranger": "http.server" in sys.modules}), flush=True)
"""


def _task(worker: subprocess.Popen, folder, imports: list[str] | None) -> dict:
    command = {"folder": str(folder), "argv": ["-c", DP_TASK], "cpu_s": 300, "file_mb": 64}
    if imports is not None:
        command["imports"] = imports
    worker.stdin.write(json.dumps(command) + "\n")
    worker.stdin.flush()
    said = json.loads(worker.stdout.readline())
    assert json.loads(worker.stdout.readline()) == {"zygote": "exited", "code": 0}
    return said


def test_a_dp_sgd_task_has_the_zygote_import_opacus_once_for_it_and_those_after(
    tmp_path,
) -> None:
    """A DP-SGD task's command names `trainer.dp_sgd`: the zygote imports it before that
    fork (the task finds Opacus loaded, and trains with it in the forked child) and keeps it
    for the next; a module that is not ON_DEMAND is never imported on a command's word."""
    assert imports_for({"spec": {"privacy": {"mode": "sample", "clip_norm": 1}}}) == (
        "trainer.dp_sgd",
    )
    assert imports_for({"spec": {"privacy": {"mode": "update"}}}) == ()
    assert imports_for({"spec": "not a spec"}) == imports_for({}) == ()
    with zygote() as worker:
        plain = _task(worker, tmp_path, None)  # before any DP task: imports it itself
        assert plain == {"already": False, "steps": 4, "finite": True, "stranger": False}
        first = _task(worker, tmp_path, ["trainer.dp_sgd", "http.server"])
        assert first == {"already": True, "steps": 4, "finite": True, "stranger": False}
        after = _task(worker, tmp_path, [])
        assert after["already"] is True and after["steps"] == 4
