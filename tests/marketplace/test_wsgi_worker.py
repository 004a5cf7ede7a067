"""What a gunicorn worker sets up as it loads the WSGI application."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_server_worker_hands_the_gil_over_sooner_than_the_default(tmp_path: Path) -> None:
    """Claims on one job queue for its escrow lock; its holder must not wait 5 ms (Python's
    default switch interval) for the GIL after each of its round trips (wsgi.py)."""
    code = "import sys, marketplace.server.wsgi; print(sys.getswitchinterval())"
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
        "GPUFLEX_DATA_DIR": str(tmp_path),
        "GPUFLEX_DEV": "1",
    }
    env.pop("DATABASE_URL", None)  # nothing is queried: the embedded SQLite will do
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    assert float(out) < 0.005
