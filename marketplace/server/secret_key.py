"""The server's SECRET_KEY: what counts as weak, and the development key kept per data dir.

No Django here: `gpuflex serve` checks the key before it starts anything, and the settings
read the development key while Django is still loading them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

MIN_LENGTH = 50
# keys that were ever written in this repository: anyone can sign sessions with them
PUBLIC_KEYS = frozenset({"gpuflex-development-key-not-for-production-use-0000"})
DEV_KEY_FILE = "secret_key"
TRUE = {"1", "true", "yes", "on"}


def dev_mode(env: Mapping[str, str]) -> bool:
    """GPUFLEX_DEV=1 (or `gpuflex serve --dev`): an explicit local development server."""
    return env.get("GPUFLEX_DEV", "").strip().lower() in TRUE


def weakness(key: str) -> str | None:
    """Why `key` must not sign a public server's sessions and CSRF tokens; None if it may."""
    if not key:
        return "is not set"
    if key in PUBLIC_KEYS or key.startswith("django-insecure"):
        return "is a public development key"
    if len(key) < MIN_LENGTH or len(set(key)) < 5:
        return f"is shorter than {MIN_LENGTH} random characters"
    return None


def serve_problem(env: Mapping[str, str]) -> str | None:
    """Why `gpuflex serve` must refuse to start with this environment, or None."""
    if dev_mode(env):
        return None
    problem = weakness(env.get("SECRET_KEY", ""))
    if problem is None:
        return None
    return (
        f"SECRET_KEY {problem}. Set SECRET_KEY to at least {MIN_LENGTH} random characters "
        "(python -c 'import secrets; print(secrets.token_urlsafe(50))'), or run a local "
        "development server with --dev (GPUFLEX_DEV=1), which keeps a generated key in the "
        "data dir."
    )


def for_data_dir(data_dir: Path) -> str:
    """This data dir's own random key, made on first use and kept (mode 0600) so that
    sessions outlive a restart; never a constant anyone else knows."""
    path = Path(data_dir) / DEV_KEY_FILE
    if not path.exists():
        # written beside it and linked into place: a web server and a worker starting at once
        # agree on one key, and nobody reads a half-written file
        tmp = path.with_name(f".{DEV_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(secrets.token_urlsafe(MIN_LENGTH))
            with contextlib.suppress(FileExistsError):  # another process won: use its key
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text(encoding="ascii").strip()
