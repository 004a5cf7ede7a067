"""Key material: generation and hashing, nothing else (no Django models here)."""

from __future__ import annotations

import hashlib
import secrets

USER_PREFIX = "gfx_u_"
NODE_PREFIX = "gfx_n_"


def new_key(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def display_prefix(key: str) -> str:
    return key[:12]
