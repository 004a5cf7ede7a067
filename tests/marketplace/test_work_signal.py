"""The "new work" signal that wakes waiting claims (marketplace/rounds/signals.py)."""

from __future__ import annotations

import os

from marketplace.rounds.signals import bump_work_generation, work_generation


def test_every_bump_moves_the_embedded_signal_even_within_one_clock_tick(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    bump_work_generation()
    signal = next(tmp_path.iterdir())
    tick = signal.stat().st_mtime_ns
    seen = [work_generation()]
    for _ in range(5):
        bump_work_generation()
        # as a coarse kernel clock stamps bumps that come close together: the same time
        os.utime(signal, ns=(tick, tick))
        seen.append(work_generation())
    assert len(set(seen)) == len(seen)
