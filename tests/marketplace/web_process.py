"""Run a script as a web process would (the WSGI app's settings, the test database over
PostgreSQL, no eager Celery) and report which heavy modules it imported and from where: the
harness of the torch-free web tests (issue 36)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "safetensors", "transformers", "tokenizers")

# what every such script starts with: Django set up, then a finder that keeps the stack of
# the first heavy import (the modules named on the command line)
PRELUDE = """
import importlib.abc, json, os, sys, traceback
import django
django.setup()

first = []

class Watch(importlib.abc.MetaPathFinder):  # where a heavy module was first imported from
    def find_spec(self, name, path, target=None):
        if name in sys.argv[1:] and not first:
            first.append(name + ":\\n" + "".join(traceback.format_stack(limit=25)))
        return None

sys.meta_path.insert(0, Watch())
"""

# what every such script ends with: `out` printed with the heavy modules it imported
REPORT = """
out["heavy"] = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
out["first"] = first
print("RESULT " + json.dumps(out))
"""


def database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    user = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{user}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def run_web(body: str, data_dir: Path, **env: str) -> dict[str, Any]:
    """`PRELUDE + body + REPORT` in a fresh interpreter; its `out`, heavy imports included."""
    full = (
        os.environ
        | {
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
            "DATABASE_URL": database_url(),
            "GPUFLEX_DATA_DIR": str(data_dir),
        }
        | env
    )
    for name in ("PROMETHEUS_MULTIPROC_DIR", "GPUFLEX_METRICS_DIR", "CELERY_TASK_ALWAYS_EAGER"):
        full.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + body + REPORT, *HEAVY], cwd=ROOT, env=full,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))
