"""Where `gpuflex serve` may listen: gunicorn alone on a loopback address or a Unix socket,
anything else only with a reverse proxy declared in front of it.

gunicorn's threads read each request's body themselves, so clients that send a body a byte a
second hold every thread and starve everyone else (docs/settings.md, the reverse proxy). A
proxy that reads whole requests first (`gpuflex nginx-config`) is what makes a reachable server
safe; `gpuflex serve` therefore refuses to be reachable without one rather than leave that to a
line in the docs. No Django here: the check runs before anything starts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

PROXIES_ENV = "GPUFLEX_TRUSTED_PROXIES"


def declared_proxies(env: Mapping[str, str]) -> int:
    """GPUFLEX_TRUSTED_PROXIES as a count; 0 when unset or not a whole number."""
    raw = env.get(PROXIES_ENV, "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() else 0


def bind_host(bind: str) -> str | None:
    """The host part of a gunicorn --bind address; None for a Unix socket or an inherited
    file descriptor (reachable only on this machine). A bare port is gunicorn's 0.0.0.0."""
    if bind.startswith(("unix:", "fd://")):
        return None
    if bind.startswith("["):  # [::1]:8000
        return bind[1 : bind.find("]")] if "]" in bind else bind
    host, sep, _port = bind.rpartition(":")
    if not sep:  # "8000" or "localhost": gunicorn reads a lone number as a port
        return "0.0.0.0" if bind.isdigit() else bind
    return host or "0.0.0.0"


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost may resolve to anything
        return False


def bind_problem(bind: str, env: Mapping[str, str]) -> str | None:
    """Why `gpuflex serve --bind BIND` must refuse to start in this environment, or None."""
    host = bind_host(bind)
    if host is None or is_loopback(host) or declared_proxies(env) > 0:
        return None
    return (
        f"--bind {bind} is reachable from other machines, and gunicorn alone lets slow clients "
        "hold all its threads. Put nginx in front (`gpuflex nginx-config` prints its server "
        "block; docs/settings.md) and declare it with --behind-proxy (or "
        f"{PROXIES_ENV}=1), or bind a loopback address such as 127.0.0.1:8000."
    )
