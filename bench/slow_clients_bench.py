"""Slow clients against `gpuflex serve`, bare and behind nginx (`--only slow_clients`).

An attacker opens connections and sends half a request, a byte now and then: each one parks
one of the server's application threads once its headers are in. This measures what an
honest client's request costs meanwhile, with no slow clients (the baseline) and with more of
them than the server has threads, on the server alone and through the nginx block of
marketplace/server/proxy.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.marketplace_bench import ROOT, _free_port, _manage, _register_nodes, _server_env
from marketplace.server.proxy import ProxySettings, nginx_binary, standalone_nginx

PROBE = "/api/v1/nodes/"  # a 401 without a key: no database work, only the server's own


def _wait_listening(url: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            httpx.get(url + PROBE, timeout=5)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def serving(
    *, workers: int = 1, threads: int = 4, proxy: ProxySettings | None = None
) -> Iterator[str]:
    """`gpuflex serve` on a free port, and nginx in front of it when `proxy` is given (its
    listen and upstream are filled in); yields the URL clients use and a node's key."""
    with tempfile.TemporaryDirectory(prefix="gpuflex-slow-") as tmp:
        env = _server_env(Path(tmp), None) | {"SECRET_KEY": secrets.token_urlsafe(48)}
        env.pop("DATABASE_URL", None)  # its own SQLite, whatever database the caller uses
        _manage(env, "migrate", "--noinput", "-v", "0")
        provider_key = _manage(env, "create_account", "slow", "--role", "provider").strip()
        port = _free_port()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "marketplace.cli",
                    "serve",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    str(workers),
                    "--threads",
                    str(threads),
                    "--no-migrate",
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        ]
        url = f"http://127.0.0.1:{port}"
        try:
            if proxy is not None:
                _wait_listening(url)  # else nginx answers 502 for it, which is no wait
                front = _free_port()
                settings = dataclasses.replace(
                    proxy, listen=f"127.0.0.1:{front}", upstream=f"127.0.0.1:{port}"
                )
                procs.append(
                    subprocess.Popen(
                        standalone_nginx(settings, Path(tmp) / "nginx"),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
                url = f"http://127.0.0.1:{front}"
            (node_key,) = _register_nodes(url, provider_key, 1)  # waits for it to listen
            yield url, node_key
        finally:
            for proc in reversed(procs):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 15)
                proc.wait(timeout=30)


class SlowClients:
    """`n` connections that send a node's heartbeat with whole headers and then one byte of
    its announced body every `every_s`, never finishing it: the server reads the body of an
    authenticated request, and that read is what parks a thread."""

    def __init__(self, url: str, node_key: str, n: int, every_s: float = 1.0) -> None:
        host, port = url.removeprefix("http://").split(":")
        head = (
            "POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {node_key}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n{"
        ).encode()
        self.socks = []
        for _ in range(n):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(head)
            self.socks.append(s)
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(self._every):
            for s in list(self.socks):
                try:
                    s.sendall(b" ")
                except OSError:  # the server hung up on it: what a proxy should do
                    self.socks.remove(s)
                    self.closed_by_server += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            s.close()


def latencies(url: str, n: int, timeout_s: float) -> list[float | None]:
    """Seconds each of `n` sequential honest requests took; None where it timed out."""
    out: list[float | None] = []
    with httpx.Client(base_url=url, timeout=timeout_s) as http:
        for _ in range(n):
            started = time.perf_counter()
            try:
                http.get(PROBE)
                out.append(time.perf_counter() - started)
            except httpx.TimeoutException:
                out.append(None)
    return out


def _summary(times: list[float | None], timeout_s: float) -> dict[str, Any]:
    done = [t for t in times if t is not None]
    return {
        "requests": len(times),
        "timed_out": len(times) - len(done),
        "p50_ms": 1000 * statistics.median(done) if done else None,
        "max_ms": 1000 * max(done) if done else None,
        "timeout_s": timeout_s,
    }


def run(slow: int = 200, requests: int = 10, timeout_s: float = 5.0) -> dict[str, Any]:
    # `gpuflex serve`'s defaults on a 2-core machine: 2 workers x 16 threads, fewer threads
    # than slow clients, which is the attack's point
    shape = {"workers": 2, "threads": 16}
    out: dict[str, Any] = {"slow_clients": slow, **shape}
    for mode, proxy in (("alone", None), ("nginx", ProxySettings())):
        if mode == "nginx" and nginx_binary() is None:
            out[mode] = None
            continue
        with serving(**shape, proxy=proxy) as (url, node_key):
            base = _summary(latencies(url, requests, timeout_s), timeout_s)
            attack = SlowClients(url, node_key, slow)
            try:
                time.sleep(1.0)  # let every slow connection reach a thread
                under = _summary(latencies(url, requests, timeout_s), timeout_s)
            finally:
                attack.close()
        out[mode] = {"baseline": base, "slow": under}
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
