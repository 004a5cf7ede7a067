"""Where the server processes keep their metrics between scrapes (prometheus_client's
multiprocess mode): one folder per launcher under `<data dir>/metrics/`, wiped when that
launcher starts so that a restarted process does not add its predecessor's counts twice,
and merged by /metrics with the folders of the others (web, worker, beat) on this host.

No Django here: `gpuflex serve` / `worker` / `beat` call it before exec'ing the web server or
Celery, and prometheus_client reads PROMETHEUS_MULTIPROC_DIR when it is first imported."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

# the root whose subfolders /metrics merges (set by the launchers beside the variable below)
ROOT_VAR = "GPUFLEX_METRICS_DIR"
PROCESS_VAR = "PROMETHEUS_MULTIPROC_DIR"


def data_dir(env: dict[str, str]) -> Path:
    """The data folder the settings will use (settings/base.py's DATA_DIR), read the same way."""
    return Path(env.get("GPUFLEX_DATA_DIR") or Path.cwd() / ".gpuflex").resolve()


def prepare(env: dict[str, str], role: str) -> dict[str, str]:
    """The environment for a launcher of `role` (web-<bind>, worker-<queues>, beat): its own
    empty metrics folder. An operator's own PROMETHEUS_MULTIPROC_DIR is kept and not wiped
    (their supervisor owns it)."""
    if env.get(PROCESS_VAR):
        return env | {ROOT_VAR: env.get(ROOT_VAR) or env[PROCESS_VAR]}
    root = data_dir(env) / "metrics"
    folder = root / re.sub(r"[^A-Za-z0-9_.-]+", "_", role)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return env | {PROCESS_VAR: str(folder), ROOT_VAR: str(root)}


def files() -> list[str]:
    """Every process's metric file to merge now: the root's subfolders (and the root)."""
    root = os.environ.get(ROOT_VAR) or os.environ.get(PROCESS_VAR)
    if not root:
        return []
    base = Path(root)
    return sorted(str(p) for p in [*base.glob("*.db"), *base.glob("*/*.db")])


def enabled() -> bool:
    return bool(os.environ.get(PROCESS_VAR))
