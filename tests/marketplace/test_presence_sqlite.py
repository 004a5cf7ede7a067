"""The embedded default (SQLite, no Redis) writes presence straight through the same
service: heartbeats, claims' seen marks, lease extension and offline detection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_presence_without_redis_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env |= {"GPUFLEX_DATA_DIR": str(tmp_path), "PYTHONPATH": str(HERE.parent.parent)}
    out = subprocess.run(
        [sys.executable, str(HERE / "sqlite_presence.py")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "vendor": "sqlite", "redis": "", "heartbeat": 200, "state": "working", "pending": 0,
        "claim": 200, "state_after_claim": "idle", "lease_kept": True, "offline": True,
    }  # fmt: skip
