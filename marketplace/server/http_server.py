"""The command line `gpuflex serve` runs: granian serving the WSGI application.

Why granian and not gunicorn (issue 36, eleventh pass; docs/scale.md): gunicorn's gthread
worker parses HTTP and hands each request between its threads in Python, 0.42 ms of CPU a
request on this project's two-core machine with an application that does nothing, about
40 % of a heartbeat's server CPU. granian reads and writes HTTP in Rust and holds the GIL
only to call the application: 0.10 ms for the same nothing. Its request bodies stream
(`wsgi.input` reads from the socket as the application asks: an upload is never held in
memory whole) and a streamed response (the live pages' events) goes out as it is yielded.

Like gunicorn's threads, a request body is read by the application's thread, so a client
that sends its body a byte a second holds that thread: `gpuflex serve` is still reachable
only behind the proxy that reads whole requests first (server/bind.py).

No Django here: the command is built before anything is imported.
"""

from __future__ import annotations

import ipaddress
import socket

from marketplace.server.bind import BindError, split_bind

# how long an idle application thread is kept: its database connection (Django's, one per
# thread) goes with it, and opening one again costs a claim more than the claim itself
THREAD_IDLE_S = 600
# how long a worker may take to finish its requests once told to stop (long polls end
# within GPUFLEX_MAX_CLAIM_WAIT_S, 30 s at most)
STOP_GRACE_S = 35


def listen_address(host: str, bind: str) -> str:
    """`host` as the IP address granian takes: a name (localhost, a host name) resolved as
    gunicorn resolved it, to its first address; BindError naming a name that does not
    resolve."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise BindError(f"--bind {bind}: the host {host!r} does not resolve ({exc})") from None
    return str(found[0][4][0])


def command(
    executable: str, bind: str, workers: int, threads: int, *, access_log: bool = False
) -> list[str]:
    """granian's argv for `gpuflex serve`: `workers` processes, each running the
    application on up to `threads` threads (a long poll, claim?wait=30, parks one)."""
    where = split_bind(bind)
    listen = (
        ["--uds", where.uds]
        if where.uds is not None
        else ["--host", listen_address(where.host, bind), "--port", str(where.port)]
    )
    cmd = [
        executable,
        "--interface", "wsgi",
        *listen,
        "--workers", str(workers),
        "--blocking-threads", str(threads),
        "--blocking-threads-idle-timeout", str(THREAD_IDLE_S),
        # a worker that died (out of memory, a native crash) is started again, as
        # gunicorn's arbiter did
        "--respawn-failed-workers",
        "--workers-kill-timeout", str(STOP_GRACE_S),
        "--no-ws",
    ]  # fmt: skip
    if access_log:  # else none at all: a log nobody reads is still formatted per request
        cmd.append("--access-log")
    return [*cmd, "marketplace.server.wsgi:application"]
