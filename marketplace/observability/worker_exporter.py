"""`gpuflex worker --metrics-port N` (GPUFLEX_METRICS_PORT): the worker host's event metrics
over HTTP, for a host that runs no web server whose /metrics would merge them. The database
gauges are left to the web servers' /metrics: every host would report the same ones."""

from __future__ import annotations

import logging
import os

from prometheus_client import start_http_server

from marketplace.observability import exposition

log = logging.getLogger(__name__)


def serve_from_env() -> object | None:
    """Start the exporter thread when GPUFLEX_METRICS_PORT is set; its server, else None."""
    raw = os.environ.get("GPUFLEX_METRICS_PORT", "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise ValueError(f"GPUFLEX_METRICS_PORT is {raw!r}; it takes a port number") from None
    addr = os.environ.get("GPUFLEX_METRICS_ADDR", "127.0.0.1")
    server, _thread = start_http_server(port, addr=addr, registry=exposition.events())
    log.info("metrics: serving on %s:%s", addr, server.server_address[1])
    return server
