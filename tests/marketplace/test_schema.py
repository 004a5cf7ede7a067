from __future__ import annotations

import threading
from typing import Any

from rest_framework.test import APIClient


def test_openapi_schema_lists_the_agent_contract(db) -> None:
    response = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in [
        "/api/v1/nodes/",
        "/api/v1/agent/heartbeat",
        "/api/v1/agent/claim",
        "/api/v1/agent/tasks/{task_id}/model",
        "/api/v1/agent/tasks/{task_id}/shard",
        "/api/v1/agent/tasks/{task_id}/update",
        "/api/v1/agent/tasks/{task_id}/fail",
        "/api/v1/agent/tasks/{task_id}/secagg",
        "/api/v1/agent/tasks/{task_id}/secagg/shares",
        "/api/v1/agent/tasks/{task_id}/secagg/unmask",
        "/api/v1/agent/me",
        "/api/v1/jobs/",
    ]:
        assert path in paths, path


def test_interactive_docs_are_served(db) -> None:
    response = APIClient().get("/api/v1/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()


def test_unknown_path_is_a_json_404(db) -> None:
    response = APIClient().get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_concurrent_first_schema_requests_share_one_generation(db, monkeypatch) -> None:
    """Issue 36: racing first requests for the schema on a fresh worker returned 500
    (drf-spectacular's extension loading, tfranzel/drf-spectacular#1122) and each request
    paid a full generation. Now the schema is generated once per process and served to all:
    every thread reaches the view before the first generation may finish, and still only one
    generation runs."""
    from django.db import connections
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.views import SpectacularAPIView

    from marketplace.api import schema_view

    schema_view.clear_cache()  # as in a fresh process
    threads = 6
    start = threading.Barrier(threads)
    arrived = threading.Semaphore(0)
    generations: list[int] = []
    real_get, real_generate = SpectacularAPIView.get, SchemaGenerator.get_schema

    def get(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        arrived.release()
        return real_get(self, request, *args, **kwargs)

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        generations.append(1)
        if len(generations) == 1:  # the first waits until every request is in the view
            for _ in range(threads):
                assert arrived.acquire(timeout=60)
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(SpectacularAPIView, "get", get)
    monkeypatch.setattr(SchemaGenerator, "get_schema", generate)
    answers: list[tuple[int, bytes]] = []

    def fetch() -> None:
        try:
            start.wait(timeout=60)
            response = APIClient().get(
                "/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json"
            )
            answers.append((response.status_code, response.content))
        finally:
            connections.close_all()

    workers = [threading.Thread(target=fetch) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [status for status, _ in answers] == [200] * threads
    assert len({body for _, body in answers}) == 1
    assert len(generations) == 1
    schema_view.clear_cache()
