"""Slow clients cannot starve `gpuflex serve` behind the nginx block it documents.

Each slow client sends an authenticated heartbeat's headers and then never finishes its body:
on the server alone that parks a thread per client (`make bench` measures it: every honest
request timed out), behind nginx the body is buffered there and the server never sees them.
"""

from __future__ import annotations

import socket

import pytest

from bench.slow_clients_bench import SlowClients, latencies, serving
from marketplace.server.proxy import ProxySettings, nginx_binary

pytestmark = [
    pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (make system-deps)"),
    pytest.mark.integration,
]


def test_slow_clients_neither_starve_honest_ones_nor_hold_on_once_they_stall() -> None:
    # one stack for both checks: starting it (migrations, the server, nginx) is most of the cost
    proxy = ProxySettings(header_timeout_s=2, body_timeout_s=2)
    with serving(workers=1, threads=4, proxy=proxy) as (url, node_key):
        attack = SlowClients(url, node_key, 12, every_s=0.5)  # three times the threads
        stalled = SlowClients(url, node_key, 3, every_s=3600)  # sends nothing more
        try:
            # a generous ceiling: without the proxy these never answer at all
            assert None not in latencies(url, 5, timeout_s=60)
            for s in stalled.socks:
                s.settimeout(60)
                reply = b""
                while chunk := _recv(s):
                    reply += chunk
                # nginx answers 408 and closes, or just closes
                assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply[:80]
        finally:
            attack.close()
            stalled.close()


def _recv(s: socket.socket) -> bytes:
    try:
        return s.recv(4096)
    except ConnectionResetError:
        return b""
