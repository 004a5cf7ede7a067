"""A cheap "new work may be available" counter, so idle long polls skip the database.

It lives in the shared cache (Redis in production). The embedded setup's cache is each
process's own memory, and the worker that opens a round is not the web process whose long
polls wait for it: there the counter is a file's modification time in the data folder, so a
new round wakes waiting claims at once instead of at their next fallback poll.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from django.conf import settings
from django.core.cache import cache

KEY = "gpuflex:work-generation"


def _signal_file() -> Path | None:
    if "locmem" not in settings.CACHES["default"]["BACKEND"].lower():
        return None
    return Path(settings.DATA_DIR) / "work-generation"


def bump_work_generation() -> None:
    path = _signal_file()
    if path is not None:
        with contextlib.suppress(OSError):
            path.touch()  # a new modification time: what waiting claims compare
        return
    try:
        cache.incr(KEY)
    except ValueError:  # not set yet (or evicted)
        cache.set(KEY, 1, timeout=None)


def work_generation() -> int:
    path = _signal_file()
    if path is not None:
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return 0
    return int(cache.get(KEY, 0))
