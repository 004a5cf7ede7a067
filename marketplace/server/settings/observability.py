"""Observability settings (docs/deploy.md, "Observability"), kept apart from base.py.

GPUFLEX_LOG_FORMAT   plain (default) or json: one JSON object a log line with the request id
GPUFLEX_METRICS_TOKEN  a bearer token that lets a scraper read /metrics from anywhere; unset,
                     /metrics answers only on loopback with no proxy in between
OTEL_EXPORTER_OTLP_ENDPOINT  traces go there over OTLP/HTTP (marketplace/observability/
                     tracing.py); unset, no tracing at all
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

LOG_FORMATS = {
    "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    "json": {"()": "marketplace.observability.logs.JsonFormatter"},
}
LOG_FORMAT = os.environ.get("GPUFLEX_LOG_FORMAT", "plain").strip().lower() or "plain"
if LOG_FORMAT not in LOG_FORMATS:
    raise ImproperlyConfigured(
        f"GPUFLEX_LOG_FORMAT is {LOG_FORMAT!r}; it takes one of {', '.join(LOG_FORMATS)}"
    )
LOG_FORMATTER = LOG_FORMATS[LOG_FORMAT]

GPUFLEX_METRICS_TOKEN = os.environ.get("GPUFLEX_METRICS_TOKEN", "")

OBSERVABILITY_MIDDLEWARE = [
    # request counts and durations by route, around everything after them
    "marketplace.observability.middleware.RequestMetricsMiddleware",
    # /healthz, /readyz, /metrics ahead of host checks, HTTPS redirects and sessions
    "marketplace.observability.middleware.OperationsMiddleware",
]
