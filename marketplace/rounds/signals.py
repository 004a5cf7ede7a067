"""A cheap "new work may be available" counter, so idle long polls skip the database.

It lives in the shared cache (Redis in production). The embedded setup's cache is each
process's own memory, and the worker that opens a round is not the web process whose long
polls wait for it: there the counter is a file in the data folder that each bump appends a
byte to, so a new round wakes waiting claims at once instead of at their next fallback poll.
Its size counts, with its modification time: the kernel stamps times at a few milliseconds'
grain, and two bumps that close would otherwise look like one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from django.conf import settings
from django.core.cache import cache

KEY = "gpuflex:work-generation"
MAX_SIGNAL_BYTES = 1 << 20


def _signal_file() -> Path | None:
    if "locmem" not in settings.CACHES["default"]["BACKEND"].lower():
        return None
    return Path(settings.DATA_DIR) / "work-generation"


def bump_work_generation() -> None:
    path = _signal_file()
    if path is not None:
        with contextlib.suppress(OSError), path.open("ab") as signal:
            signal.write(b"\n")  # O_APPEND: bumps from several processes all count
            if signal.tell() > MAX_SIGNAL_BYTES:
                signal.truncate(0)  # its time changes all the same
        return
    try:
        cache.incr(KEY)
    except ValueError:  # not set yet (or evicted)
        cache.set(KEY, 1, timeout=None)


def work_generation() -> int:
    path = _signal_file()
    if path is not None:
        try:
            st = path.stat()
        except OSError:
            return 0
        return st.st_size * 10**20 + st.st_mtime_ns  # any bump changes it
    return int(cache.get(KEY, 0))
