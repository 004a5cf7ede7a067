"""A cheap "new work may be available" counter, so idle long polls skip the database."""

from __future__ import annotations

from django.core.cache import cache

KEY = "gpuflex:work-generation"


def bump_work_generation() -> None:
    try:
        cache.incr(KEY)
    except ValueError:  # not set yet (or evicted)
        cache.set(KEY, 1, timeout=None)


def work_generation() -> int:
    return int(cache.get(KEY, 0))
