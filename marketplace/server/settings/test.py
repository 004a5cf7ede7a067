"""Tests: PostgreSQL (TEST_DATABASE_URL, else the local server), eager Celery, a temp data dir.

Without a reachable PostgreSQL the suite falls back to a SQLite file, so it still runs on
a bare machine; the tests that need PostgreSQL itself skip then. The integration test
switches Celery to a real worker on Redis itself.
"""

from __future__ import annotations

import os
import socket
import tempfile
import warnings
from pathlib import Path

LOCAL_POSTGRES = "postgres://postgres@127.0.0.1:5432/gpuflex"


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


os.environ.setdefault("GPUFLEX_DATA_DIR", tempfile.mkdtemp(prefix="gpuflex-test-"))
if "TEST_DATABASE_URL" in os.environ:
    os.environ["DATABASE_URL"] = os.environ["TEST_DATABASE_URL"]
elif _postgres_up():
    os.environ.setdefault("DATABASE_URL", LOCAL_POSTGRES)
else:
    warnings.warn("PostgreSQL is not running on 127.0.0.1:5432; testing on SQLite", stacklevel=1)
    os.environ.setdefault(
        "DATABASE_URL", f"sqlite:///{Path(os.environ['GPUFLEX_DATA_DIR']) / 'gpuflex.sqlite3'}"
    )
os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "1")
# segment checks are drawn at random: tests that want them set the share (1 or 0) themselves
os.environ.setdefault("GPUFLEX_SEGMENT_CHECK_SHARE", "0")

from marketplace.server.settings.base import *  # noqa: E402, F403
from marketplace.server.settings.base import DATA_DIR, DATABASES, GPUFLEX  # noqa: E402

DATABASES["default"]["CONN_MAX_AGE"] = 0
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # a file, not Django's shared-cache memory database: threads must see real locking
    DATABASES["default"]["TEST"] = {"NAME": str(Path(DATA_DIR) / "test.sqlite3")}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
GPUFLEX["MAX_DATASET_BYTES"] = 2 * 2**20
# no platform spot checks unless a test asks for them (test_node_trust.py): a replica that
# no second platform node takes would hold a platform-tier round until its deadline
GPUFLEX["PLATFORM_SPOT_CHECK_RATE"] = 0.0
# no node is judged by its tasks' speed unless a test asks (test_ledger_speed.py): in tests a
# task's compute time is the test machine's load, not the node's speed, and a busy moment
# would read as a node that inflated its benchmark
GPUFLEX["SPEED_MARGIN"] = 1e9
# and the benchmark stays the speed figure (sizing, sharding, billing) for the same reason
GPUFLEX["SPEED_PRIOR_TASKS"] = 1e9
# small so that a test can exceed it without building a huge body
GPUFLEX["MAX_UPDATE_BYTES"] = 4 * 2**20
DATA_UPLOAD_MAX_MEMORY_SIZE = GPUFLEX["MAX_UPDATE_BYTES"]
Path(DATA_DIR).mkdir(parents=True, exist_ok=True)

from marketplace.server.settings.base import REST_FRAMEWORK  # noqa: E402

# The suite makes many users, keys, jobs and bad keys from one address; the throttle tests
# (tests/marketplace/test_throttles.py) set small rates on the classes themselves.
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] |= dict.fromkeys(
    ("auth_failure", "submit", "key_create", "signup"), "100000/min"
)
