"""A JSON-RPC proxy between the marketplace and the chain node whose connection can be cut.

``cut_at(method, forward=True)``: the next request for ``method`` reaches the node (or, with
``forward=False``, does not), and then the link is down: that request and every one after it
has its connection closed without an answer, as when the network drops mid-settlement, until
``restore()``. Closing without an answer is what the client sees of a real outage: the node
may well have acted on what it received.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CuttableRpcProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.forwarded: list[str] = []  # methods that reached the node, in order
        self._lock = threading.Lock()
        self._down = False
        self._cut_method: str | None = None
        self._cut_forwards = True
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> CuttableRpcProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def cut_at(self, method: str, forward: bool = True) -> None:
        with self._lock:
            self._cut_method, self._cut_forwards = method, forward

    def restore(self) -> None:
        with self._lock:
            self._down, self._cut_method = False, None

    @property
    def is_down(self) -> bool:
        with self._lock:
            return self._down

    def _decide(self, method: str) -> tuple[bool, bool]:
        """(forward it, answer it) for a request, taking the link down at the cut."""
        with self._lock:
            if self._down:
                return False, False
            if method == self._cut_method:
                self._down = True
                return self._cut_forwards, False
            return True, True

    def _forward(self, body: bytes) -> bytes:
        request = urllib.request.Request(self.upstream, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return bytes(response.read())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                method = str(json.loads(body).get("method", ""))
                forward, answer = proxy._decide(method)
                reply = b""
                if forward:
                    reply = proxy._forward(body)
                    with proxy._lock:
                        proxy.forwarded.append(method)
                if not answer:
                    self.close_connection = True  # hang up: the client gets no response
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep the test output quiet

        return Handler
