"""The reverse proxy in front of `gpuflex serve`: an nginx server block.

The server's application threads read a request's body themselves (server/http_server.py;
under gunicorn, which it ran before, its headers too, with no read timeout: 40 connections
that sent half a request parked 40 threads, and everyone else's requests waited behind them,
12 to 20 s in the attack that found it). nginx reads whole requests on its event loop, cuts
off clients that stall (client_header_timeout, client_body_timeout) and only then hands the
server a complete request, so a slow client costs the server nothing.
`gpuflex nginx-config` prints this block; docs/settings.md says where it goes.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProxySettings:
    listen: str = "80"
    # one `gpuflex serve --bind` address, or several separated by commas (docs/deploy.md)
    upstream: str = "127.0.0.1:8000"
    server_name: str = "_"
    # an update may be MAX_UPDATE_BYTES (256 MiB) plus its headers
    max_body_mb: int = 260
    # a client must send its headers, and each piece of its body, within these
    header_timeout_s: int = 10
    body_timeout_s: int = 10
    # claims long-poll up to MAX_CLAIM_WAIT_S (30 s): the upstream read waits longer
    upstream_read_timeout_s: int = 75


def nginx_server_block(s: ProxySettings) -> str:
    servers = "".join(
        f"    server {u.strip()} max_fails=1 fail_timeout=5s;\n" for u in s.upstream.split(",")
    )
    # A request that could not reach one web server goes to the next, but only if nothing of
    # it was sent (nginx never retries a POST it delivered): an upload is never made twice.
    return f"""upstream gpuflex_app {{
{servers}    keepalive 32;
}}

server {{
    listen {s.listen};
    server_name {s.server_name};

    client_header_timeout {s.header_timeout_s}s;
    client_body_timeout {s.body_timeout_s}s;
    send_timeout 30s;
    keepalive_timeout 15s;
    client_max_body_size {s.max_body_mb}m;
    client_body_buffer_size 1m;

    location / {{
        # the whole request body is read here before the server sees the request
        proxy_request_buffering on;
        proxy_buffering on;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_read_timeout {s.upstream_read_timeout_s}s;
        proxy_next_upstream error timeout http_502 http_503;
        proxy_pass http://gpuflex_app;
    }}
}}
"""


def nginx_standalone_config(s: ProxySettings, prefix: str) -> str:
    """A whole nginx.conf around the block, for one unprivileged run under `prefix` (the
    tests and `make bench`; a real deployment includes the block in its distribution's
    nginx.conf instead)."""
    block = nginx_server_block(s).replace("\n", "\n    ")
    return f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    {block}
}}
"""


def nginx_binary() -> str | None:
    """nginx lives in /usr/sbin, which a non-root PATH often lacks."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.path.exists(p)), None
    )


def standalone_nginx(settings: ProxySettings, prefix: Path) -> list[str]:
    """Write nginx_standalone_config under `prefix` and return the command that runs it."""
    prefix.mkdir(parents=True, exist_ok=True)
    for folder in (prefix.parent, prefix):
        folder.chmod(0o755)  # a root nginx's workers run as nobody
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_standalone_config(settings, str(prefix)))
    return [nginx_binary() or "nginx", "-p", str(prefix), "-c", str(conf)]
