"""marketplace.jobs.files on the filesystem storage: writes are atomic, and a content-addressed
file that a killed process left cut short is written again, never taken for the whole."""

from __future__ import annotations

from pathlib import Path

from django.core.files.storage import storages

from marketplace.jobs import files


def test_a_cut_off_content_addressed_file_is_written_again() -> None:
    name = "jobs/test-files/updates/abc.safetensors"
    path = Path(storages["default"].path(name))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"x" * 1000
    path.write_bytes(data[:300])  # what a web server killed mid-upload used to leave
    assert files.put(name, data, content_addressed=True) == name
    assert path.read_bytes() == data
    path.write_bytes(data)  # whole: left alone
    mtime = path.stat().st_mtime_ns
    files.put(name, data, content_addressed=True)
    assert path.stat().st_mtime_ns == mtime
    files.put(name, b"y" * 10)  # a per-job singleton is replaced
    assert path.read_bytes() == b"y" * 10
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left
