"""Chunked dataset uploads through `gpuflex serve` on loopback (`--only upload`).

A generated CSV dataset (500 MB by default) goes up through the SDK's resumable upload
(marketplace.client.Client.upload: sha256, 8 MiB chunks PUT with Content-Range, finish with
the server's size and hash check and the move into storage), against a real `gpuflex
serve`. Beside it, in the same process, the baseline: a raw copy of the same bytes to
another file on the same disk (fsynced, as the server fsyncs each chunk). The web
worker's peak resident memory shows that chunks are streamed to disk, never held whole.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.marketplace_bench import ROOT, _free_port, _manage, _server_env
from bench.slow_clients_bench import _wait_listening
from marketplace.client import CHUNK_BYTES, Client, file_sha256

MB = 1e6


def generate_csv(path: Path, nbytes: int, seed: int = 0) -> int:
    """A CSV dataset of 16 features and a label, `nbytes` or a little more: blocks of
    distinct random rows, written as they are made (the bench's memory stays small)."""
    rng = np.random.default_rng(seed)
    with path.open("w", encoding="ascii") as out:
        out.write(",".join(f"f{i}" for i in range(16)) + ",label\n")
        while out.tell() < nbytes:
            x = rng.normal(size=(20_000, 16)).round(5)
            y = rng.integers(0, 10, size=(20_000, 1))
            np.savetxt(out, np.hstack([x, y]), fmt=["%.5f"] * 16 + ["%d"], delimiter=",")
    return path.stat().st_size


def copy_baseline(source: Path, target: Path) -> float:
    """Seconds to copy the file to another file on the same disk, fsynced."""
    start = time.perf_counter()
    with source.open("rb") as src, target.open("wb") as out:
        shutil.copyfileobj(src, out, 2**20)
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - start


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def _peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a process, Linux only."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


@contextlib.contextmanager
def serving(data_dir: Path, database_url: str | None) -> Iterator[tuple[str, str, int]]:
    """`gpuflex serve` (one worker) on a free port; yields its URL, a buyer's key and the
    web server's main pid."""
    env = _server_env(data_dir, database_url) | {"SECRET_KEY": secrets.token_urlsafe(48)}
    if not database_url:
        env.pop("DATABASE_URL", None)  # its own SQLite, whatever database the caller uses
    _manage(env, "migrate", "--noinput", "-v", "0")
    key = _manage(env, "create_account", "uploader", "--role", "buyer").strip()
    port = _free_port()
    cmd = [sys.executable, "-m", "marketplace.cli", "serve", "--bind", f"127.0.0.1:{port}",
           "--workers", "1", "--threads", "4", "--no-migrate"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_listening(url)
        yield url, key, proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def run(size_mb: int = 500, database_url: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuflex-upload-bench-") as tmp:
        root = Path(tmp)
        data = root / "dataset.csv"
        nbytes = generate_csv(data, size_mb * 10**6)
        copy_s = copy_baseline(data, root / "copy.csv")
        (root / "copy.csv").unlink()
        start = time.perf_counter()
        file_sha256(data)
        hash_s = time.perf_counter() - start
        with serving(root / "server", database_url) as (url, key, master):
            workers = _children(master)
            before = {pid: _peak_rss_mb(pid) for pid in workers}
            chunks: list[float] = []
            with Client(url, key, timeout=300) as client:
                start = time.perf_counter()
                upload = client.upload(
                    data, progress=lambda done, total: chunks.append(time.perf_counter())
                )
                upload_s = time.perf_counter() - start
            peak = {pid: _peak_rss_mb(pid) for pid in workers}
        assert upload["status"] == "complete" and upload["size"] == nbytes
        # the chunk phase: from the first progress report (hashed, session open) to the last
        # chunk's answer; the rest is the client's hash and the server's finish
        put_s = chunks[-1] - chunks[0]
        first_worker = workers[0] if workers else None
        return {
            "bytes": nbytes,
            "chunk_bytes": CHUNK_BYTES,
            "upload_s": upload_s,
            "upload_mb_s": nbytes / MB / upload_s,
            "chunks_mb_s": nbytes / MB / put_s,
            "client_hash_s": hash_s,
            "copy_s": copy_s,
            "copy_mb_s": nbytes / MB / copy_s,
            "ratio_to_copy": (nbytes / upload_s) / (nbytes / copy_s),
            "worker_rss_mb_before": first_worker and before.get(first_worker),
            "worker_peak_rss_mb": first_worker and peak.get(first_worker),
            "database": "postgresql" if database_url else "sqlite",
        }


def render(r: dict[str, Any]) -> list[str]:
    return [
        "## Chunked dataset upload (`gpuflex serve` on loopback)",
        "",
        f"A generated {r['bytes'] / MB:,.0f} MB CSV through `Client.upload` "
        f"({r['chunk_bytes'] // 2**20} MiB chunks, one web worker, {r['database']}): "
        "sha256 on the client, chunks streamed to disk and fsynced, then the server's size "
        "and hash check and the move into storage (`python -m bench.run --only upload`).",
        "",
        "| | seconds | MB/s |",
        "|---|---:|---:|",
        f"| raw file copy, fsynced (baseline) | {r['copy_s']:.2f} | {r['copy_mb_s']:,.0f} |",
        f"| upload, end to end | {r['upload_s']:.2f} | {r['upload_mb_s']:,.0f} |",
        f"| of which the chunks alone | | {r['chunks_mb_s']:,.0f} |",
        f"| of which the client's sha256 | {r['client_hash_s']:.2f} | |",
        "",
        f"End to end the upload runs at **{r['ratio_to_copy']:.2f}×** the raw copy's rate. "
        f"The web worker's peak resident memory: {r['worker_peak_rss_mb'] or 0:,.0f} MB "
        f"(before the upload {r['worker_rss_mb_before'] or 0:,.0f} MB) for a "
        f"{r['bytes'] / MB:,.0f} MB file.",
        "",
    ]


if __name__ == "__main__":
    import json

    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 500)))
