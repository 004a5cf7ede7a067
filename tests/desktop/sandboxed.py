"""Running a snippet of Python in the real sandbox, cold or from the warm worker."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from desktop.sandbox import Limits, Sandbox, SandboxResult

PY = sys.executable


@pytest.fixture(params=["cold", "warm"])
def task_start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A task started cold, and one forked by the warm worker, get the same guarantees."""
    monkeypatch.setenv("GPUFLEX_WARM_TASKS", "1" if request.param == "warm" else "0")
    return request.param


def run(folder: Path, code: str, **limits: float) -> SandboxResult:
    limits = {"wall_s": 60, "memory_mb": 1024, **limits}
    with Sandbox(Limits(**limits)) as sandbox:  # type: ignore[arg-type]
        return sandbox.run(folder, [PY, "-c", code])


# a snippet's preamble: report(r) writes what the task saw to report.json
REPORT = (
    "import json, pathlib\ndef report(r): pathlib.Path('report.json').write_text(json.dumps(r))\n"
)


def run_reporting(folder: Path, code: str, **limits: float) -> Any:
    """Run REPORT + `code`, which must end well, and return what it reported."""
    result = run(folder, REPORT + code, **limits)
    assert result.status == "ok", (result.detail, result.stderr_tail)
    return json.loads((folder / "report.json").read_text())
