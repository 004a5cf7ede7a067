"""desktop.input_cache: content-addressed, size-bounded, never a path from the server."""

from __future__ import annotations

import os
from pathlib import Path

from desktop.input_cache import InputCache


def _file(tmp: Path, name: str, size: int) -> Path:
    path = tmp / name
    path.write_bytes(b"x" * size)
    return path


def test_put_get_drop_and_only_hashes_name_files(tmp_path: Path) -> None:
    cache = InputCache(tmp_path / "c")
    digest = "ab" * 32
    cache.put(digest, _file(tmp_path, "a", 10))
    assert cache.get(digest) == b"x" * 10
    for bad in ("../../etc/passwd", "AB" * 32, "ab" * 31, None, 7):
        cache.put(bad, _file(tmp_path, "b", 1))
        assert cache.get(bad) is None
    assert [p.name for p in (tmp_path / "c").iterdir()] == [f"{digest}.safetensors"]
    cache.drop(digest, None)
    assert cache.get(digest) is None


def test_the_least_recently_used_go_past_the_size(tmp_path: Path) -> None:
    cache = InputCache(tmp_path / "c", max_bytes=25)
    a, b, c = ("a" * 64), ("b" * 64), ("c" * 64)
    cache.put(a, _file(tmp_path, "a", 10))
    cache.put(b, _file(tmp_path, "b", 10))
    old = (tmp_path / "c" / f"{a}.safetensors").stat().st_mtime - 100
    os.utime(tmp_path / "c" / f"{b}.safetensors", (old, old))  # b: used longest ago
    cache.put(c, _file(tmp_path, "z", 10))
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None


def test_copy_to_writes_the_cached_file_and_misses_say_so(tmp_path: Path) -> None:
    cache = InputCache(tmp_path / "c")
    digest = "cd" * 32
    cache.put(digest, _file(tmp_path, "a", 3000))
    target = tmp_path / "task" / "shard.safetensors"
    target.parent.mkdir()
    assert cache.copy_to(digest, target) and target.read_bytes() == b"x" * 3000
    target.unlink()
    assert not cache.copy_to("ef" * 32, target) and not target.exists()
    assert not cache.copy_to("../../etc/passwd", target) and not target.exists()
