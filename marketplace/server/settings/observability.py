"""Observability settings (docs/deploy.md, "Observability"), kept apart from base.py.

GPUFLEX_LOG_FORMAT   plain (default) or json: one JSON object a log line with the request id
GPUFLEX_METRICS_TOKEN  a bearer token that lets a scraper read /metrics from anywhere; unset,
                     /metrics answers only on loopback with no proxy in between
OTEL_EXPORTER_OTLP_ENDPOINT  traces go there over OTLP/HTTP (marketplace/observability/
                     tracing.py); unset, no tracing at all
"""

from __future__ import annotations

from marketplace.server.settings.environment import read

LOG_FORMATS = {
    "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    "json": {"()": "marketplace.observability.logs.JsonFormatter"},
}
# declared and checked in environment.py: a bad GPUFLEX_LOG_FORMAT stops the import there,
# naming the variable, what it got and what it wants
_env = read()
LOG_FORMAT = _env["GPUFLEX_LOG_FORMAT"]
LOG_FORMATTER = LOG_FORMATS[LOG_FORMAT]
GPUFLEX_METRICS_TOKEN = _env["GPUFLEX_METRICS_TOKEN"]

OBSERVABILITY_MIDDLEWARE = [
    # request counts and durations by route, around everything after them
    "marketplace.observability.middleware.RequestMetricsMiddleware",
    # /healthz, /readyz, /metrics ahead of host checks, HTTPS redirects and sessions
    "marketplace.observability.middleware.OperationsMiddleware",
]
