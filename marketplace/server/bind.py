"""Where `gpuflex serve` may listen: the server alone on a loopback address or a Unix socket,
anything else only with a reverse proxy declared in front of it.

The server's application threads read each request's body themselves (server/http_server.py),
so clients that send a body a byte a second can hold every thread and starve everyone else
(docs/settings.md, the reverse proxy). A proxy that reads whole requests first (`gpuflex
nginx-config`) is what makes a reachable server safe; `gpuflex serve` therefore refuses to be
reachable without one rather than leave that to a line in the docs. No Django here: the check
runs before anything starts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

PROXIES_ENV = "GPUFLEX_TRUSTED_PROXIES"


def declared_proxies(env: Mapping[str, str]) -> int:
    """GPUFLEX_TRUSTED_PROXIES as a count; 0 when unset or not a whole number."""
    raw = env.get(PROXIES_ENV, "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() else 0


# a --bind without a port: gunicorn's default, kept since operators' units name addresses so
DEFAULT_PORT = 8000


class BindError(ValueError):
    """A --bind address the server cannot listen on, named in the message."""


@dataclass(frozen=True)
class Bind:
    """A --bind address: a host and port, or a Unix socket's path (`uds`)."""

    host: str = ""
    port: int = 0
    uds: str | None = None


def split_bind(bind: str) -> Bind:
    """A --bind address (`HOST:PORT`, `[IPV6]:PORT`, `PORT`, `HOST`, `unix:PATH`) in parts;
    BindError naming what is wrong otherwise."""
    if bind.startswith("unix:"):
        if not bind[5:]:
            raise BindError(f"--bind {bind}: a Unix socket needs a path (unix:/run/gpuflex.sock)")
        return Bind(uds=bind[5:])
    if bind.startswith("fd://"):
        raise BindError(f"--bind {bind}: an inherited socket is not supported; bind an "
                        "address or a Unix socket (unix:PATH)")  # fmt: skip
    if bind.startswith("["):  # [::1]:8000
        host, _, rest = bind[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise BindError(f"--bind {bind}: wants [IPV6]:PORT")
    elif bind.isdigit():  # a lone number is a port on every address
        host, port = "0.0.0.0", bind
    else:
        host, sep, port = bind.rpartition(":")
        if not sep:  # "localhost": the default port
            host, port = bind, ""
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise BindError(f"--bind {bind}: the port {port!r} is not a number from 1 to 65535")
    return Bind(host=host or "0.0.0.0", port=int(port) if port else DEFAULT_PORT)


def bind_host(bind: str) -> str | None:
    """The host part of a --bind address; None for a Unix socket (reachable only on this
    machine). A bare port listens on every address (0.0.0.0)."""
    if bind.startswith(("unix:", "fd://")):
        return None
    try:
        return split_bind(bind).host
    except BindError:
        return None  # refused by bind_problem for what it is


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost may resolve to anything
        return False


def bind_problem(bind: str, env: Mapping[str, str]) -> str | None:
    """Why `gpuflex serve --bind BIND` must refuse to start in this environment, or None."""
    try:
        split_bind(bind)
    except BindError as exc:
        return str(exc)
    host = bind_host(bind)
    if host is None or is_loopback(host) or declared_proxies(env) > 0:
        return None
    return (
        f"--bind {bind} is reachable from other machines, and the server alone lets slow clients "
        "hold all its threads. Put nginx in front (`gpuflex nginx-config` prints its server "
        "block; docs/settings.md) and declare it with --behind-proxy (or "
        f"{PROXIES_ENV}=1), or bind a loopback address such as 127.0.0.1:8000."
    )
