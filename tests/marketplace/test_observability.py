"""Issue 36 item 1: /healthz, /readyz, /metrics, JSON logs and traces (docs/deploy.md,
"Observability")."""

from __future__ import annotations

import importlib
import io
import json
import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from marketplace.observability import tracing
from marketplace.observability.logs import JsonFormatter
from marketplace.server.request_id import RequestIdFilter

CLOSED = "127.0.0.1:1"  # nothing listens on port 1: a dependency that is down


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a /metrics body."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def test_healthz_answers_without_the_database_or_a_known_host() -> None:
    """A liveness probe names the server by its address, which ALLOWED_HOSTS need not list.
    No django_db mark: any database access here would raise."""
    response = Client().get("/healthz", HTTP_HOST="10.1.2.3:8000")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert Client().post("/healthz").status_code == 405


@pytest.mark.django_db
def test_readyz_is_ready_when_database_broker_and_cache_answer() -> None:
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": "ok", "broker": "ok", "cache": "ok"}


@pytest.mark.django_db
def test_readyz_names_a_cache_that_is_down(settings) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "marketplace.server.redis_cache.RedisCache",
            "LOCATION": f"redis://{CLOSED}/0",
        }
    }
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["cache"] and body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok" and "Connection" in body["checks"]["cache"]


@pytest.mark.django_db
def test_readyz_names_a_broker_that_is_down(settings) -> None:
    settings.CELERY_BROKER_URL = f"redis://{CLOSED}/0"
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]


@pytest.mark.django_db
def test_metrics_expose_gpuflex_series_by_route_not_path() -> None:
    client = Client()
    assert client.get("/api/v1/jobs/").status_code == 401  # no key
    assert client.get("/no/such/page/12345").status_code == 404
    found = scrape(client)
    names = {name for name, _ in found}
    assert {"gpuflex_nodes", "gpuflex_task_queue_depth", "gpuflex_escrow_held_credits",
            "gpuflex_settlement_lag_seconds", "gpuflex_rounds_in_flight"} <= names  # fmt: skip
    assert all(
        name.startswith("gpuflex_")
        for name in names
        if not name.startswith(("python_", "process_"))
    ), names
    unauthorized = ("gpuflex_http_requests_total",
                    (("method", "GET"), ("route", "/api/v1/jobs/"), ("status", "401")))  # fmt: skip
    assert found[unauthorized] >= 1
    routes = {dict(labels).get("route") for name, labels in found if "http_requests" in name}
    assert "<unmatched>" in routes and not any("12345" in (r or "") for r in routes)
    assert found[("gpuflex_state_scrape_errors", (("part", "nodes"),))] == 0


def test_metrics_are_refused_off_loopback_without_the_token(settings) -> None:
    assert Client(REMOTE_ADDR="10.0.0.5").get("/metrics").status_code == 403
    # through a proxy on this host: the scraper is whoever the proxy forwarded
    assert Client(HTTP_X_FORWARDED_FOR="10.0.0.5").get("/metrics").status_code == 403
    settings.GPUFLEX_METRICS_TOKEN = "s3cret-token"
    assert Client().get("/metrics").status_code == 403
    wrong = Client(HTTP_AUTHORIZATION="Bearer nope").get("/metrics")
    assert wrong.status_code == 403 and "GPUFLEX_METRICS_TOKEN" in wrong.json()["detail"]


@pytest.mark.django_db
def test_metrics_answer_anywhere_with_the_token(settings) -> None:
    settings.GPUFLEX_METRICS_TOKEN = "s3cret-token"
    client = Client(REMOTE_ADDR="10.0.0.5", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert client.get("/metrics").status_code == 200


def test_json_log_lines_parse_and_carry_the_request_id() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        response = Client().get("/no/such/page", HTTP_X_REQUEST_ID="req-abc.123")
    finally:
        logger.removeHandler(handler)
    assert response.status_code == 404
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines and lines[-1]["request_id"] == "req-abc.123"
    assert lines[-1]["level"] == "WARNING" and "/no/such/page" in lines[-1]["message"]
    assert lines[-1]["logger"] == "django.request" and lines[-1]["status"] == 404


def test_log_format_setting_is_checked(monkeypatch) -> None:
    from marketplace.server.settings import observability

    try:
        monkeypatch.setenv("GPUFLEX_LOG_FORMAT", "json")
        assert importlib.reload(observability).LOG_FORMATTER["()"].endswith("JsonFormatter")
        monkeypatch.setenv("GPUFLEX_LOG_FORMAT", "xml")
        with pytest.raises(ImproperlyConfigured, match="GPUFLEX_LOG_FORMAT is 'xml'"):
            importlib.reload(observability)
    finally:
        monkeypatch.delenv("GPUFLEX_LOG_FORMAT")
        importlib.reload(observability)


def test_no_tracing_without_an_endpoint(monkeypatch, settings) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert tracing.configure_from_env() is False
    assert not any("opentelemetry" in m for m in settings.MIDDLEWARE)


def test_heartbeats_are_counted(make_agent) -> None:
    agent = make_agent()
    before = REGISTRY.get_sample_value("gpuflex_heartbeats_total", {"state": "idle"}) or 0
    assert agent.heartbeat().status_code == 200
    assert REGISTRY.get_sample_value("gpuflex_heartbeats_total", {"state": "idle"}) == before + 1
