"""The reverse proxy in front of `gpuflex serve`: an nginx server block.

gunicorn's threads read a request's headers and body themselves, with no read timeout: 40
connections that send half a request park 40 threads, and everyone else's requests wait
behind them (12 to 20 s in the attack that found it). nginx reads whole requests on its
event loop, cuts off clients that stall (client_header_timeout, client_body_timeout) and only
then hands gunicorn a complete request, so a slow client costs gunicorn nothing.
`gpuflex nginx-config` prints this block; docs/settings.md says where it goes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProxySettings:
    listen: str = "80"
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
    return f"""upstream gpuflex_app {{
    server {s.upstream};
    keepalive 32;
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
        # the whole request body is read here before gunicorn sees the request
        proxy_request_buffering on;
        proxy_buffering on;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_read_timeout {s.upstream_read_timeout_s}s;
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
