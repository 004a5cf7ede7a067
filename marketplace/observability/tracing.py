"""OpenTelemetry traces, exported over OTLP/HTTP when an endpoint is configured
(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, the SDK's own variables,
as are OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_HEADERS and the sampler's). Without one nothing
is imported and nothing is sent.

The web process gets a span per request (opentelemetry-instrumentation-django), named by its
URL pattern and carrying the request id; the worker a span per Celery task."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

_configured = False


def endpoint() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )


def configure_from_env() -> bool:
    """Set up tracing once per process if an endpoint is configured; whether it is on."""
    global _configured
    if _configured:
        return True
    if not endpoint():
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME") or _default_service()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    # the batch processor's thread is restarted in forked children (the web workers, Celery's)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _instrument_django()
    _instrument_celery()
    _configured = True
    log.info("tracing: spans go to %s as %s", endpoint(), service)
    return True


def _default_service() -> str:
    return "gpuflex-worker" if os.environ.get("GPUFLEX_PROCESS_ROLE") == "worker" else "gpuflex-web"


def _response_hook(span: Any, request: Any, response: Any) -> None:
    request_id = getattr(request, "request_id", None)
    if request_id and span.is_recording():
        span.set_attribute("gpuflex.request_id", request_id)


def _instrument_django() -> None:
    try:
        from opentelemetry.instrumentation.django import DjangoInstrumentor
    except ImportError:  # the instrumentation package is optional: spans from our middleware
        log.warning("tracing: opentelemetry-instrumentation-django is not installed")
        return
    instrumentor = DjangoInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(response_hook=_response_hook)


def _instrument_celery() -> None:
    """A span per task, from Celery's signals (no instrumentation package needed)."""
    from celery import signals
    from opentelemetry import trace

    tracer = trace.get_tracer("marketplace.celery")
    spans: dict[str, Any] = {}

    def started(task_id: str = "", task: Any = None, **_: Any) -> None:
        span = tracer.start_span(f"celery {getattr(task, 'name', 'task')}")
        span.set_attribute("celery.task_id", task_id)
        spans[task_id] = span

    def ended(task_id: str = "", state: str = "", **_: Any) -> None:
        span = spans.pop(task_id, None)
        if span is not None:
            span.set_attribute("celery.state", state or "")
            span.end()

    signals.task_prerun.connect(started, weak=False)
    signals.task_postrun.connect(ended, weak=False)
