"""Issue 36 item 1: /healthz, /readyz, /metrics, JSON logs and traces (docs/deploy.md,
"Observability")."""

from __future__ import annotations

import importlib
import io
import json
import logging
import secrets
from pathlib import Path

import pytest
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
    from marketplace.server.settings.environment import SettingsError

    try:
        monkeypatch.setenv("GPUFLEX_LOG_FORMAT", "json")
        assert importlib.reload(observability).LOG_FORMATTER["()"].endswith("JsonFormatter")
        monkeypatch.setenv("GPUFLEX_LOG_FORMAT", "xml")
        with pytest.raises(SettingsError, match="GPUFLEX_LOG_FORMAT: got 'xml', wants"):
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


def _value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db(transaction=True)
def test_a_real_round_moves_the_round_counters(make_agent, submit, buyer) -> None:
    """/metrics scraped before, during and after a job's two rounds run through the API."""
    from tests.marketplace.test_job_flow import run_until_idle

    client = Client()
    before = scrape(client)
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")
    during = scrape(client)  # round 1 open, its three tasks waiting
    assert _value(during, "gpuflex_rounds_opened_total") == (
        _value(before, "gpuflex_rounds_opened_total") + 1
    )
    assert _value(during, "gpuflex_rounds_in_flight", status="open") == 1
    assert _value(during, "gpuflex_task_queue_depth") == 3
    assert _value(during, "gpuflex_nodes", state="idle") == 3
    assert _value(during, "gpuflex_escrow_held_credits") == 10.0  # the job's budget

    assert run_until_idle(agents) == 6
    assert buyer.get(f"/api/v1/jobs/{job['id']}/").json()["status"] == "completed"
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("gpuflex_rounds_opened_total") == 2
    assert moved("gpuflex_rounds_closed_total") == 2
    assert moved("gpuflex_rounds_finished_total", outcome="done") == 2
    assert moved("gpuflex_round_duration_seconds_count", outcome="done") == 2
    assert moved("gpuflex_aggregation_seconds_count") == 2
    assert moved("gpuflex_aggregation_seconds_sum") > 0
    assert moved("gpuflex_leases_total") == 6
    assert moved("gpuflex_claims_total", outcome="leased") == 6
    assert moved("gpuflex_claims_total", outcome="empty") >= 3  # each agent's last claim
    claims = [
        labels
        for name, labels in after
        if name == "gpuflex_http_requests_total" and ("status", "200") in labels
    ]
    assert any(("route", "/api/v1/agent/claim") in labels for labels in claims), claims
    assert _value(after, "gpuflex_rounds_in_flight", status="open") == 0
    assert _value(after, "gpuflex_task_queue_depth") == 0
    assert _value(after, "gpuflex_escrow_held_credits") == 0  # charged and released


def _database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{user}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_gpuflex_serve_answers_health_readiness_and_metrics(tmp_path) -> None:
    """The real thing: the web server started by `gpuflex serve`, its metrics in the multiprocess
    folder the launcher made, its log lines JSON."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {
        "GPUFLEX_DATA_DIR": str(tmp_path),
        "DATABASE_URL": _database_url(),
        "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
        "GPUFLEX_LOG_FORMAT": "json",
    }
    for name in ("PROMETHEUS_MULTIPROC_DIR", "GPUFLEX_METRICS_DIR", "GPUFLEX_LOG_FILE"):
        env.pop(name, None)
    stale = tmp_path / "metrics" / f"web-127.0.0.1_{port}"
    stale.mkdir(parents=True)
    (stale / "counter_999999.db").write_bytes(b"left by a previous run")  # wiped at start
    command = [sys.executable, "-m", "marketplace.cli", "serve", "--dev", "--no-migrate",
               "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4"]  # fmt: skip
    out = (tmp_path / "serve.out").open("wb")
    server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (tmp_path / "serve.out").read_text()
            try:
                health = httpx.get(f"{base}/healthz", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gpuflex serve never answered"
                time.sleep(0.5)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        ready = httpx.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        missing = httpx.get(f"{base}/no/such/page", headers={"X-Request-ID": "serve-req-1"})
        assert missing.status_code == 404
        scraped = httpx.get(f"{base}/metrics", timeout=30)
        assert scraped.status_code == 200, scraped.text
        found = samples(scraped.text)
        routes = {(dict(labels)["route"], dict(labels)["status"])
                  for name, labels in found if name == "gpuflex_http_requests_total"}  # fmt: skip
        assert {("/healthz", "200"), ("/readyz", "200"), ("<unmatched>", "404")} <= routes
        assert ("gpuflex_nodes", (("state", "idle"),)) in found
        # counted in the worker's file, in the launcher's freshly emptied folder
        assert not (stale / "counter_999999.db").exists()
        assert any(stale.glob("counter_*.db"))
    finally:
        server.terminate()
        server.wait(timeout=60)
        out.close()
    lines = (tmp_path / "logs" / "marketplace.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert any(
        r["request_id"] == "serve-req-1" and "/no/such/page" in r["message"] for r in records
    ), records


TRACED_REQUEST = """
import django
django.setup()
from django.test import Client
from opentelemetry import trace
assert Client().get("/healthz", HTTP_X_REQUEST_ID="trace-req-1").status_code == 200
trace.get_tracer_provider().shutdown()  # flushes the batch to the collector
"""


def test_requests_are_traced_to_the_configured_otlp_endpoint(tmp_path) -> None:
    """A collector (an HTTP server here) receives the request's span over OTLP/HTTP."""
    import os
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = os.environ | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "OTEL_SERVICE_NAME": "gpuflex-web-test",
        "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.test",
        "GPUFLEX_DATA_DIR": str(tmp_path),
    }
    try:
        run = subprocess.run([sys.executable, "-c", TRACED_REQUEST], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr
    spans = []
    for path, body in received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                spans += [(service["service.name"], s) for s in scope.spans]
    assert spans, run.stderr
    wanted = ("gpuflex.request_id", "trace-req-1")
    tagged = [
        (service, span)
        for service, span in spans
        if any((a.key, a.value.string_value) == wanted for a in span.attributes)
    ]
    assert [service for service, _ in tagged] == ["gpuflex-web-test"], spans


@pytest.mark.django_db
def test_the_grafana_dashboard_graphs_only_series_the_server_exposes() -> None:
    import re
    from pathlib import Path

    dashboard = Path(__file__).parents[2] / "deploy" / "grafana" / "gpuflex-dashboard.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    graphed = {name for expr in exprs for name in re.findall(r"gpuflex_[a-z_]+", expr)}
    exposed = {name for name, _ in scrape(Client())}
    exposed |= set(REGISTRY._names_to_collectors)  # labelled series not yet observed
    assert graphed and graphed <= exposed, graphed - exposed


def test_launchers_give_each_process_kind_a_fresh_metrics_folder(monkeypatch, tmp_path) -> None:
    from marketplace import cli

    monkeypatch.setenv("GPUFLEX_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    for name in ("PROMETHEUS_MULTIPROC_DIR", "GPUFLEX_METRICS_DIR", "GPUFLEX_METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    envs: list[dict[str, str]] = []
    monkeypatch.setattr(cli, "_exec", lambda cmd, env: envs.append(env) or 0)
    monkeypatch.setattr(cli.subprocess, "run", lambda *a, **k: 0)
    assert cli.main(["serve", "--bind", "127.0.0.1:8123"]) == 0
    assert cli.main(["worker", "--queues", "aggregation", "--metrics-port", "9101"]) == 0
    assert cli.main(["beat"]) == 0
    web, worker, beat = envs
    root = tmp_path / "metrics"
    assert web["PROMETHEUS_MULTIPROC_DIR"] == str(root / "web-127.0.0.1_8123")
    assert worker["PROMETHEUS_MULTIPROC_DIR"] == str(root / "worker-aggregation")
    assert beat["PROMETHEUS_MULTIPROC_DIR"] == str(root / "beat")
    assert {e["GPUFLEX_METRICS_DIR"] for e in envs} == {str(root)}
    assert worker["GPUFLEX_METRICS_PORT"] == "9101" and worker["GPUFLEX_PROCESS_ROLE"] == "worker"
    assert all(Path(e["PROMETHEUS_MULTIPROC_DIR"]).is_dir() for e in envs)


COUNT_ROUNDS = """
import sys
from marketplace.observability.metrics import ROUNDS_OPENED
ROUNDS_OPENED.inc(int(sys.argv[1]))
"""


def test_the_worker_exporter_adds_up_every_process_of_the_host(monkeypatch, tmp_path) -> None:
    """Two processes (a web worker, a Celery worker) count in their own folders; the
    worker host's exporter, like /metrics, serves the sum."""
    import os
    import subprocess
    import sys

    import httpx

    from marketplace.observability import worker_exporter

    root = tmp_path / "metrics"
    for folder, count in (("web-x", 2), ("worker-all", 3)):
        (root / folder).mkdir(parents=True)
        env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(root / folder)}
        subprocess.run([sys.executable, "-c", COUNT_ROUNDS, str(count)], env=env, check=True,
                       timeout=120)  # fmt: skip
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(root / "worker-all"))
    monkeypatch.setenv("GPUFLEX_METRICS_DIR", str(root))
    monkeypatch.setenv("GPUFLEX_METRICS_PORT", "0")
    server = worker_exporter.serve_from_env()
    try:
        port = server.server_address[1]  # type: ignore[attr-defined]
        found = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
    finally:
        server.shutdown()  # type: ignore[attr-defined]
    assert found[("gpuflex_rounds_opened_total", ())] == 5
    monkeypatch.setenv("GPUFLEX_METRICS_PORT", "91o1")
    with pytest.raises(ValueError, match="GPUFLEX_METRICS_PORT is '91o1'"):
        worker_exporter.serve_from_env()


def test_celery_lines_are_json_too_when_asked(settings) -> None:
    from marketplace.server.celery import _json_logs

    stream = io.StringIO()
    logger = logging.getLogger("test.celery.json")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        settings.LOG_FORMAT = "plain"
        _json_logs(logger=logger)  # as Celery's after_setup_logger calls it
        assert not isinstance(handler.formatter, JsonFormatter)
        settings.LOG_FORMAT = "json"
        _json_logs(logger=logger)
        logger.warning("worker %s ready", "w1")
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["message"] == "worker w1 ready" and line["request_id"] == "-"
