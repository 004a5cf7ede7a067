from __future__ import annotations

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
