"""Failpoints: named places where the fault tests make the server pause, so that a process
can be killed at exactly that moment. Inert unless GPUFLEX_FAILPOINTS names them, e.g.
GPUFLEX_FAILPOINTS="aggregation.before_commit=sleep:5" (comma-separated)."""

from __future__ import annotations

import logging
import os
import time
from functools import cache

log = logging.getLogger(__name__)


@cache
def _points() -> dict[str, str]:
    points = {}
    for item in os.environ.get("GPUFLEX_FAILPOINTS", "").split(","):
        name, _, action = item.strip().partition("=")
        if name:
            points[name] = action
    return points


def failpoint(name: str) -> None:
    action = _points().get(name)
    if action is None:
        return
    kind, _, arg = action.partition(":")
    if kind == "sleep":
        log.warning("failpoint %s: sleeping %s s", name, arg)
        time.sleep(float(arg))
    else:
        raise ValueError(f"failpoint {name}: unknown action {action!r} (use sleep:SECONDS)")
