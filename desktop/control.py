"""The client of the running agent's local API (desktop.local_api): `gpuflex-node status|
pause|resume|settings|logs|stop|datasets` and the tray app both talk to the agent through this.

Where the agent listens is in `<data>/run/agent.json` (the folder 0700, the file 0600):
    {"pid", "version", "transport": "unix", "path"}            POSIX: a Unix socket (0600)
    {"pid", "version", "transport": "tcp", "port", "token"}    Windows: 127.0.0.1 + a token
The socket's file permission is the authentication on POSIX; on a loopback port, which any
local user can reach, every request carries the per-user token from that 0600 file.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from desktop.config import Paths
from desktop.entry import node_command
from desktop.local_datasets import INSPECT_TIMEOUT_S

TIMEOUT_S = 10.0


class NotRunning(ConnectionError):
    """No agent answers for this data folder."""


class ControlError(RuntimeError):
    """The agent answered with an error (a bad request, an invalid setting)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def run_dir(paths: Paths) -> Path:
    return paths.data / "run"


def endpoint_file(paths: Paths) -> Path:
    return run_dir(paths) / "agent.json"


def make_run_dir(paths: Paths) -> Path:
    d = run_dir(paths)
    d.mkdir(parents=True, exist_ok=True)
    if os.name == "posix":
        os.chmod(d, stat.S_IRWXU)  # 0700: only this user reaches the socket and the token
    return d


def write_private(path: Path, text: str) -> None:
    """Written 0600 from the start (the token must never be readable by others)."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    tmp.replace(path)


@dataclass(frozen=True)
class Endpoint:
    transport: str  # "unix" | "tcp"
    pid: int = 0
    path: str = ""
    port: int = 0
    token: str = ""

    @classmethod
    def read(cls, paths: Paths) -> Endpoint:
        try:
            d = json.loads(endpoint_file(paths).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise NotRunning(f"no agent is running for {paths.data}") from exc
        return cls(str(d.get("transport", "")), int(d.get("pid", 0)), str(d.get("path", "")),
                   int(d.get("port", 0)), str(d.get("token", "")))  # fmt: skip

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.transport == "unix":
            return _UnixConnection(self.path, timeout)
        if self.transport == "tcp":
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        raise NotRunning(f"unknown transport {self.transport!r} in the endpoint file")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class ControlClient:
    """One request per call, each on its own connection: safe from any thread."""

    def __init__(self, paths: Paths | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.paths = paths or Paths.default()
        self.timeout_s = timeout_s

    def request(
        self, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> Any:
        ep = Endpoint.read(self.paths)
        headers = {"Content-Type": "application/json"}
        if ep.token:
            headers["Authorization"] = f"Bearer {ep.token}"
        data = None if body is None else json.dumps(body).encode()
        conn = ep.connection(timeout_s or self.timeout_s)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as exc:  # refused, gone, timed out, not ours to open
            raise NotRunning(f"the agent (pid {ep.pid}) does not answer: {exc}") from exc
        finally:
            conn.close()
        try:
            answer = json.loads(raw or b"null")
        except ValueError:
            answer = {"error": raw.decode(errors="replace")[:200]}
        if resp.status >= 400:
            msg = answer.get("error") if isinstance(answer, dict) else None
            raise ControlError(resp.status, str(msg or f"HTTP {resp.status}"))
        return answer

    # --- the API, one method per endpoint (docs in desktop/local_api.py)

    def running(self) -> bool:
        try:
            self.request("GET", "/status")
        except (NotRunning, ControlError):
            return False
        return True

    def status(self) -> dict[str, Any]:
        return dict(self.request("GET", "/status"))

    def pause(self, reason: str = "") -> dict[str, Any]:
        return dict(self.request("POST", "/pause", {"reason": reason}))

    def resume(self) -> dict[str, Any]:
        return dict(self.request("POST", "/resume", {}))

    def settings(self) -> dict[str, Any]:
        return dict(self.request("GET", "/settings"))

    def update_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("PATCH", "/settings", changes))

    def login(self, key: str) -> dict[str, Any]:
        return dict(self.request("POST", "/login", {"key": key}))

    def logs(self, n: int = 100, after: int = 0) -> list[dict[str, Any]]:
        return list(self.request("GET", "/logs?" + urlencode({"n": n, "after": after})))

    def tasks(self, n: int = 50) -> list[dict[str, Any]]:
        return list(self.request("GET", "/tasks?" + urlencode({"n": n})))

    def stop(self) -> dict[str, Any]:
        return dict(self.request("POST", "/stop", {}))

    def datasets(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/datasets"))

    def add_dataset(self, name: str, path: str, **options: Any) -> dict[str, Any]:
        """Reading a large dataset takes a while: the agent answers once it has."""
        body = {"name": name, "path": path, **{k: v for k, v in options.items() if v is not None}}
        return dict(self.request("POST", "/datasets", body, timeout_s=INSPECT_TIMEOUT_S + 30))

    def remove_dataset(self, name: str) -> dict[str, Any]:
        return dict(self.request("DELETE", "/datasets?" + urlencode({"name": name})))


# ------------------------------------------------------------------ starting the service


def start_service(paths: Paths | None = None) -> str:
    """Start the agent in the background: through the installed per-user service where
    there is one (desktop.service_units), else as a detached `gpuflex-node run` whose
    output goes to `<data>/agent.log`. Returns how it was started."""
    from desktop import service_units

    paths = paths or Paths.default()
    how = service_units.start_installed()
    if how:
        return how
    paths.data.mkdir(parents=True, exist_ok=True)
    with open(paths.data / "agent.log", "ab") as out:
        kwargs: dict[str, Any] = {"start_new_session": True}
        if sys.platform == "win32":  # WINDOWS-ONLY: no console window, not the tray's child
            kwargs = {"creationflags": 0x00000008 | 0x00000200 | 0x08000000}
        proc = subprocess.Popen(node_command(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, close_fds=True, **kwargs)  # fmt: skip
    return f"spawned gpuflex-node run (pid {proc.pid})"


def ensure_running(paths: Paths | None = None, wait_s: float = 60.0) -> ControlClient:
    """The client of this user's agent, started first if it is not running."""
    client = ControlClient(paths)
    if client.running():
        return client
    start_service(client.paths)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if client.running():
            return client
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        tail = (client.paths.data / "agent.log").read_text(errors="replace")[-500:]
        raise NotRunning(f"the agent did not start; its log ends:\n{tail}")
    raise NotRunning("the agent did not start")
