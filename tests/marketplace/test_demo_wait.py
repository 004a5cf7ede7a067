"""`gpuflex demo` waits for its server on the readiness probe, not the OpenAPI schema (issue 36:
generating the schema cost seconds of CPU and racing first requests for it returned 500)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from marketplace.demo.cluster import Cluster


class _Server:
    """A stand-in web server: /readyz answers the statuses given, in turn (the last one
    repeats); every path asked for is recorded."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.paths = list(statuses), []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                status = 404
                if self.path == "/readyz":
                    status = owner.statuses.pop(0) if len(owner.statuses) > 1 else owner.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]


@pytest.fixture
def serve() -> Iterator[object]:
    servers: list[_Server] = []

    def start(statuses: list[int]) -> _Server:
        server = _Server(statuses)
        threading.Thread(target=server.httpd.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.httpd.shutdown()
        server.httpd.server_close()


def _cluster(tmp_path: Path, port: int) -> Cluster:
    cluster = Cluster(tmp_path, port=port)
    cluster.procs["web"] = SimpleNamespace(poll=lambda: None)  # type: ignore[assignment]
    return cluster


def test_the_demo_waits_until_readyz_answers_200(tmp_path: Path, serve) -> None:
    server = serve([503, 503, 200])
    _cluster(tmp_path, server.port).wait_http("web", timeout=60)
    assert server.paths == ["/readyz"] * 3  # not ready twice, then ready; no schema fetched


def test_a_server_without_a_readiness_probe_is_ready_once_it_routes(tmp_path: Path, serve) -> None:
    server = serve([404])
    _cluster(tmp_path, server.port).wait_http("web", timeout=60)
    assert server.paths == ["/readyz"]
