"""The running agent's local API: JSON over HTTP on a Unix socket (POSIX) or a loopback port
with a per-user token (Windows), for the tray app and `gpuflex-node` (desktop.control).

    GET   /status              the agent's snapshot, its pid and the login's state
    GET   /healthz             200 while the agent process answers (no token needed)
    GET   /readyz              200 when logged in, the marketplace answered the last
                               heartbeat and the warm task worker is up; else 503 naming
                               what is not (desktop.health)
    POST  /pause   {reason}    pause (the reason is shown in the tray and sent to buyers)
    POST  /resume
    GET   /settings            the settings
    PATCH /settings {f: v}     change some; checked (desktop.config.apply_changes), saved
    POST  /login   {key}       the provider key (desktop.config.sign_in)
    GET   /logs?n=&after=      the last n lines (at most 500) after sequence number `after`
    POST  /stop                stop the agent (the service manager may start it again)
    GET   /datasets            the declared local datasets (desktop.local_datasets)
    POST  /datasets {name, path, kind?, label_column?, image_size?}   read and declare one
    DELETE /datasets?name=     forget one (its file is left alone)

Errors are {"error": "..."} with 400 (bad request), 401 (token), 404, 405 or 413.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import socket
import socketserver
import stat
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from desktop import __version__, autostart
from desktop.agent import Agent
from desktop.config import CredentialsDamaged, InvalidSettings, apply_changes
from desktop.control import endpoint_file, make_run_dir, write_private
from desktop.health import readiness
from desktop.local_datasets import DatasetRefused

log = logging.getLogger("gpuflex.local_api")

MAX_BODY = 64 * 1024
DRAIN_LIMIT = 1024 * 1024  # a too-large body up to this is read and dropped, then answered
MAX_LOG_LINES = 500
MAX_TASKS = 200  # what the journal keeps of finished tasks
# sun_path holds 108 bytes on Linux, 104 on macOS: a longer data path falls back to TCP
MAX_SOCKET_PATH = 100


class _Answer:
    """An endpoint's answer with a status other than 200."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body


# answered without the token: says only that the process is up (a supervisor's probe)
_OPEN = frozenset({"/healthz"})


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class _Handler(BaseHTTPRequestHandler):
    server_version = f"gpuflex-node/{__version__}"
    api: LocalApi  # set per server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("local api: " + format, *args)  # no client address on a Unix socket

    def address_string(self) -> str:
        return "local"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        try:
            url = urlsplit(self.path)
            if url.path not in _OPEN:
                self._authorize()
            route = self.api.routes.get(url.path)
            if route is None:
                raise _BadRequest(404, f"no such endpoint {url.path!r}")
            fn = route.get(method)
            if fn is None:
                raise _BadRequest(405, f"{url.path} takes {', '.join(route)}, not {method}")
            body = self._body() if method != "GET" else None
            status, answer = 200, fn(body, parse_qs(url.query))
            if isinstance(answer, _Answer):
                status, answer = answer.status, answer.body
        except _BadRequest as exc:
            status, answer = exc.status, {"error": str(exc)}
        except (InvalidSettings, DatasetRefused) as exc:
            status, answer = 400, {"error": str(exc)}
        except Exception as exc:  # the API must answer, never take the agent down
            log.exception("local api request failed")
            status, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(answer, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorize(self) -> None:
        if not self.api.token:
            return  # a Unix socket: the 0600 file in a 0700 folder is the authentication
        given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.api.token.encode()):
            raise _BadRequest(401, "missing or wrong token (see the agent's run/agent.json)")

    def _body(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _BadRequest(400, "bad Content-Length") from None
        if length > MAX_BODY:
            if length <= DRAIN_LIMIT:
                # read what the client is sending before answering: closing on a client
                # still writing gives it a broken pipe instead of the 413
                self.rfile.read(length)
            raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            raise _BadRequest(400, "the body must be JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest(400, "the body must be a JSON object")
        return body


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class LocalApi:
    """Serves one agent; start() returns once it listens and the endpoint file is written."""

    def __init__(self, agent: Agent, transport: str | None = None) -> None:
        self.agent = agent
        self.paths = agent.paths
        sock = make_run_dir(self.paths) / "agent.sock"
        if transport is None:
            fits = len(os.fsencode(sock)) <= MAX_SOCKET_PATH
            transport = "unix" if hasattr(socket, "AF_UNIX") and fits else "tcp"
        self.transport = transport
        self.token = secrets.token_urlsafe(32) if transport == "tcp" else ""
        self.socket_path = sock
        self.routes: dict[str, dict[str, Callable[[Any, dict[str, list[str]]], Any]]] = {
            "/status": {"GET": self._status},
            "/healthz": {"GET": self._healthz},
            "/readyz": {"GET": self._readyz},
            "/pause": {"POST": self._pause},
            "/resume": {"POST": self._resume},
            "/settings": {"GET": self._settings, "PATCH": self._change_settings},
            "/login": {"POST": self._login},
            "/logs": {"GET": self._logs},
            "/tasks": {"GET": self._tasks},
            "/stop": {"POST": self._stop},
            "/datasets": {
                "GET": self._datasets,
                "POST": self._add_dataset,
                "DELETE": self._remove_dataset,
            },
        }
        self.stop_requested = threading.Event()
        handler = type("Handler", (_Handler,), {"api": self})
        self._server: socketserver.BaseServer
        if transport == "unix":
            sock.unlink(missing_ok=True)  # left by a crash: the instance lock is held, so ours
            old = os.umask(0o177)  # created 0600: never a moment others could connect
            try:
                self._server = _UnixServer(str(sock), handler)
            finally:
                os.umask(old)
            os.chmod(sock, stat.S_IRUSR | stat.S_IWUSR)
            self.endpoint: dict[str, Any] = {"transport": "unix", "path": str(sock)}
        else:
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            self._server = server
            port = server.server_address[1]
            self.endpoint = {"transport": "tcp", "port": port, "token": self.token}
        self._thread: threading.Thread | None = None

    def start(self) -> LocalApi:
        info = {"pid": os.getpid(), "version": __version__, **self.endpoint}
        write_private(endpoint_file(self.paths), json.dumps(info))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gpuflex-local-api", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(endpoint_file(self.paths).read_text(encoding="utf-8"))
            if info.get("pid") == os.getpid():  # never a newer agent's file
                endpoint_file(self.paths).unlink()
        if self.transport == "unix":
            self.socket_path.unlink(missing_ok=True)

    # --- endpoints: (body, query) -> JSON

    def _status(self, body: Any, query: dict[str, list[str]]) -> Any:
        creds = self.agent.credentials
        login: dict[str, Any] = {"backend": creds.backend}
        try:
            login["provider_key"] = bool(creds.provider_key())
        except CredentialsDamaged as exc:  # the status still answers, and says what is wrong
            login |= {"provider_key": False, "problem": str(exc)}
        return {
            **self.agent.status().to_dict(),
            "pid": os.getpid(),
            "version": __version__,
            "running": self.agent.running,
            "login": login,
        }

    def _healthz(self, body: Any, query: dict[str, list[str]]) -> Any:
        return {"status": "ok", "pid": os.getpid(), "version": __version__}

    def _readyz(self, body: Any, query: dict[str, list[str]]) -> Any:
        ready, answer = readiness(self.agent)
        return answer if ready else _Answer(503, answer)

    def _pause(self, body: dict[str, Any], query: dict[str, list[str]]) -> Any:
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise _BadRequest(400, "reason must be a string")
        self.agent.pause(reason)
        return self._status(body, query)

    def _resume(self, body: Any, query: dict[str, list[str]]) -> Any:
        self.agent.resume()
        return self._status(body, query)

    def _settings(self, body: Any, query: dict[str, list[str]]) -> Any:
        return self.agent.settings.to_dict()

    def _change_settings(self, body: dict[str, Any], query: dict[str, list[str]]) -> Any:
        old = self.agent.settings
        new = apply_changes(old, body)
        self.agent.update_settings(new)
        if new.start_at_login != old.start_at_login:
            try:
                autostart.apply(new.start_at_login)
            except OSError as exc:
                self.agent._warn(f"start at login: {exc}")
        return new.to_dict()

    def _login(self, body: dict[str, Any], query: dict[str, list[str]]) -> Any:
        key = body.get("key")
        if not isinstance(key, str):
            raise _BadRequest(400, "key (a string) is required")
        self.agent.login(key)  # desktop.config.sign_in: the one login
        return {"ok": True, "backend": self.agent.credentials.backend}

    def _logs(self, body: Any, query: dict[str, list[str]]) -> Any:
        try:
            n = int(query.get("n", ["100"])[0])
            after = int(query.get("after", ["0"])[0])
        except ValueError:
            raise _BadRequest(400, "n and after must be whole numbers") from None
        if not 0 <= n <= MAX_LOG_LINES:
            raise _BadRequest(400, f"n must be 0 to {MAX_LOG_LINES}")
        return [e.to_dict() for e in self.agent.logs(n, after)]

    def _tasks(self, body: Any, query: dict[str, list[str]]) -> Any:
        """The last tasks taken, newest first, with what became of each: a refusal the
        worker made after its 202 among them (desktop.upload_outcomes)."""
        try:
            n = int(query.get("n", ["50"])[0])
        except ValueError:
            raise _BadRequest(400, "n must be a whole number") from None
        if not 0 <= n <= MAX_TASKS:
            raise _BadRequest(400, f"n must be 0 to {MAX_TASKS}")
        return self.agent.tasks(n)

    def _datasets(self, body: Any, query: dict[str, list[str]]) -> Any:
        return [d.to_dict() for d in self.agent.datasets()]

    def _add_dataset(self, body: dict[str, Any], query: dict[str, list[str]]) -> Any:
        name, path = body.get("name"), body.get("path")
        kind, label = body.get("kind"), body.get("label_column", "label")
        size = body.get("image_size", 28)
        if not (isinstance(name, str) and isinstance(path, str)):
            raise _BadRequest(400, "name and path (strings) are required")
        if (kind is not None and not isinstance(kind, str)) or not isinstance(label, str):
            raise _BadRequest(400, "kind and label_column must be strings")
        if isinstance(size, bool) or not isinstance(size, int) or not 4 <= size <= 512:
            raise _BadRequest(400, "image_size must be a whole number from 4 to 512")
        return self.agent.add_dataset(name, path, kind, label, size).to_dict()

    def _remove_dataset(self, body: Any, query: dict[str, list[str]]) -> Any:
        name = query.get("name", [""])[0]
        if not name:
            raise _BadRequest(400, "name the dataset: DELETE /datasets?name=NAME")
        self.agent.remove_dataset(name)
        return {"removed": name}

    def _stop(self, body: Any, query: dict[str, list[str]]) -> Any:
        self.stop_requested.set()
        # the answer goes out first: stopping waits for a running task to wind down
        threading.Thread(target=self.agent.stop, name="gpuflex-stop", daemon=True).start()
        return {"stopping": True, "pid": os.getpid()}
