"""The embedded default (SQLite) never leases one task twice either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("mode", ["claims", "batch"])
def test_concurrent_claims_on_sqlite(tmp_path: Path, mode: str) -> None:
    """Threads claiming one by one (and, in batch mode, one bulk lease racing them)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {"GPUFLEX_DATA_DIR": str(tmp_path), "PYTHONPATH": str(HERE.parent.parent)}
    out = subprocess.run(
        [sys.executable, str(HERE / "sqlite_claims.py"), "6", mode],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["errors"], result["errors"]
    claims = [(node, task) for node, tasks in zip(result["nodes"], result["claimed"], strict=True)
              for task in tasks]  # fmt: skip
    counts = Counter(task for _, task in claims)
    assert counts and max(counts.values()) == 1, "a task was leased twice"
    assert dict((task, node) for node, task in claims) == result["leased"]
    assert (tmp_path / "gpuflex.sqlite3").exists()
