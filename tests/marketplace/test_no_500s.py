"""#20 finding 6: input that gave a 500 is a 4xx naming the problem, and a real 500 is heard of
(logged with a request id to stderr and a file, answered as JSON carrying that id)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from marketplace.accounts.services import create_user, issue_user_key
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC
from trainer.nesting import MAX_DEPTH, TooDeep, check_depth, loads_yaml
from trainer.spec import SpecError, load_spec

# beyond Python's recursion limit: json and PyYAML raised RecursionError (a 500)
VERY_DEEP = 3000
JUST_TOO_DEEP = MAX_DEPTH + 1


def nested_json(depth: int, leaf: str = "1") -> str:
    """Built as text: json.dumps itself would recurse."""
    return '{"a":' * depth + leaf + "}" * depth


def post_json(client: APIClient, path: str, text: str, **extra: Any) -> Any:
    return client.post(path, data=text, content_type="application/json", **extra)


def assert_too_deep(response: Any) -> None:
    assert response.status_code == 400, response.content
    assert f"nested deeper than {MAX_DEPTH} levels" in response.json()["detail"]


# -- deep JSON and YAML ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [JUST_TOO_DEEP, VERY_DEEP])
def test_a_deeply_nested_job_body_is_a_400(buyer: APIClient, depth: int) -> None:
    body = f'{{"budget": "1", "max_price_per_gpu_hour": "1", "spec": {nested_json(depth)}}}'
    assert_too_deep(post_json(buyer, "/api/v1/jobs/", body))


@pytest.mark.parametrize("depth", [JUST_TOO_DEEP, VERY_DEEP])
def test_a_deeply_nested_heartbeat_is_a_400(make_agent: Callable[..., Any], depth: int) -> None:
    agent = make_agent()
    body = f'{{"state": "idle", "metrics": {nested_json(depth)}}}'
    assert_too_deep(post_json(agent.client, "/api/v1/agent/heartbeat", body))


@pytest.mark.parametrize("depth", [JUST_TOO_DEEP, VERY_DEEP])
def test_deeply_nested_availability_is_a_400_and_stores_nothing(
    provider: APIClient, depth: int
) -> None:
    body = (
        '{"name": "deep", "kind": "volunteer", "price_per_gpu_hour": "0.4", '
        f'"hardware": {{"memory_gb": 24}}, "availability": {nested_json(depth)}}}'
    )
    assert_too_deep(post_json(provider, "/api/v1/nodes/", body))
    assert provider.get("/api/v1/nodes/").json()["count"] == 0


@pytest.mark.parametrize("depth", [JUST_TOO_DEEP, VERY_DEEP])
def test_deeply_nested_yaml_spec_text_is_a_400(buyer: APIClient, depth: int) -> None:
    text = "[" * depth + "]" * depth
    body = {"spec": text, "budget": "1", "max_price_per_gpu_hour": "1"}
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_spec"
    assert f"nested deeper than {MAX_DEPTH} levels" in response.json()["detail"]


def test_deeply_nested_block_yaml_spec_text_is_a_400(buyer: APIClient) -> None:
    text = "".join(f"{'  ' * i}a:\n" for i in range(JUST_TOO_DEEP)) + "  " * JUST_TOO_DEEP + "1\n"
    body = {"spec": text, "budget": "1", "max_price_per_gpu_hour": "1"}
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert response.status_code == 400, response.content
    assert "nested deeper than" in response.json()["detail"]


@pytest.mark.parametrize("depth", [JUST_TOO_DEEP, VERY_DEEP])
def test_a_deeply_nested_metrics_header_is_a_400(
    make_agent: Callable[..., Any], submit: Callable[..., dict[str, Any]], depth: int
) -> None:
    agent = make_agent()
    submit()
    task = agent.claim()
    assert task is not None
    response = agent.client.put(
        f"/api/v1/agent/tasks/{task['id']}/update",
        data=b"not read",
        content_type="application/octet-stream",
        HTTP_X_GPUFLEX_METRICS=nested_json(depth),
    )
    assert response.status_code == 400, response.content
    assert "X-GPUFlex-Metrics header is nested deeper than" in response.json()["detail"]


@pytest.fixture
def raised_recursion_limit() -> Any:
    """py-evm (the chain extra) raises the limit to 100000 on import: json's C scanner then
    overflowed the C stack on deep input (the process died) and PyYAML recursed for minutes."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    yield
    sys.setrecursionlimit(before)


def test_deep_input_is_refused_before_parsing_under_a_raised_recursion_limit(
    buyer: APIClient, raised_recursion_limit: None
) -> None:
    assert_too_deep(post_json(buyer, "/api/v1/jobs/", "[" * 200_000))
    body = {"spec": "[" * 200_000, "budget": "1", "max_price_per_gpu_hour": "1"}
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert "nested deeper than" in response.json()["detail"]
    quoted = '{"spec": "' + "[" * 200_000 + '"}'  # inside a string a bracket is no nesting
    assert "nested deeper" not in post_json(buyer, "/api/v1/jobs/", quoted).json()["detail"]


def test_load_spec_refuses_deep_yaml_and_json_files(tmp_path: Path) -> None:
    for name, text in [("deep.yaml", "[" * VERY_DEEP), ("deep.json", nested_json(VERY_DEEP))]:
        (tmp_path / name).write_text(text)
        with pytest.raises(SpecError, match="nested deeper than"):
            load_spec(tmp_path / name)


def test_the_depth_check_is_linear_on_alias_bombs_and_ends_on_self_reference() -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):  # 9**10 leaves if walked naively
        refs = ", ".join([f"*{chr(96 + i)}"] * 9)
        levels.append(f"{chr(97 + i)}: &{chr(97 + i)} [{refs}]")
    assert loads_yaml("\n".join(levels))["j"]
    with pytest.raises(TooDeep):
        loads_yaml("&a [*a]")
    check_depth([[[]]], limit=3)
    with pytest.raises(TooDeep):
        check_depth([[[[]]]], limit=3)


# -- query parameters and form fields ---------------------------------------------------------


def test_a_huge_limit_is_clamped(buyer: APIClient, submit: Callable[..., Any]) -> None:
    submit()
    response = buyer.get(f"/api/v1/jobs/?limit={10**20}")
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == 1


@pytest.mark.parametrize(
    ("query", "name"),
    [("limit=abc", "limit"), ("limit=0", "limit"), ("offset=-1", "offset"),
     (f"offset={10**20}", "offset"), ("limit=" + "9" * 5000, "limit")],
)  # fmt: skip
def test_a_bad_limit_or_offset_is_a_400_naming_it(
    buyer: APIClient, submit: Callable[..., Any], query: str, name: str
) -> None:
    submit()
    response = buyer.get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400, response.content
    assert name in response.json()["fields"]


@pytest.mark.parametrize("days", ["abc", "0", "367", "1e3"])
def test_bad_days_is_a_400_naming_it(provider: APIClient, days: str) -> None:
    response = provider.get(f"/api/v1/ledger/earnings?days={days}")
    assert response.status_code == 400, response.content
    assert "days" in response.json()["fields"]


def test_a_web_key_revoke_of_abc_is_a_400(db: None) -> None:
    user = create_user("revoker", "buyer")
    issue_user_key(user)
    client = Client()
    client.force_login(user)
    response = client.post("/keys/", {"revoke": "abc"})
    assert response.status_code == 400
    assert b"revoke" in response.content
    assert user.api_keys.filter(revoked_at__isnull=True).count() == 1


@pytest.mark.parametrize("value", [None, "NaN", "inf", -1, True, "lots"])
def test_a_bad_memory_size_is_a_400_and_stores_nothing(provider: APIClient, value: Any) -> None:
    body = {
        "name": "odd-memory",
        "kind": "volunteer",
        "price_per_gpu_hour": "0.40",
        "hardware": HARDWARE | {"memory_gb": value},
    }
    response = provider.post("/api/v1/nodes/", body, format="json")
    assert response.status_code == 400, response.content
    assert "memory_gb" in response.json()["detail"]
    assert provider.get("/api/v1/nodes/").json()["count"] == 0
    assert provider.get("/api/v1/market/capacity").status_code == 200


# -- heard of: request ids, logs and the JSON 500 -------------------------------------------------


def test_the_request_id_is_echoed_or_made(buyer: APIClient) -> None:
    given = buyer.get("/api/v1/ledger/balance", HTTP_X_REQUEST_ID="proxy-1234.5")
    assert given["X-Request-ID"] == "proxy-1234.5"
    made = buyer.get("/api/v1/ledger/balance", HTTP_X_REQUEST_ID="bad id\nforged log line")
    assert len(made["X-Request-ID"]) == 32 and "\n" not in made["X-Request-ID"]
    assert buyer.get("/api/v1/ledger/balance")["X-Request-ID"] != made["X-Request-ID"]


def _log_text() -> str:
    for handler in logging.getLogger("marketplace").handlers:
        handler.flush()
    return Path(settings.LOG_FILE).read_text(encoding="utf-8")


def test_an_unexpected_error_is_a_json_500_logged_with_its_request_id(
    buyer: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("capacity exploded")

    monkeypatch.setattr("marketplace.api.views.market.market_capacity", broken)
    response = buyer.get("/api/v1/market/capacity", HTTP_X_REQUEST_ID="trace-me-500")
    assert response.status_code == 500
    body = response.json()
    assert body["error"] == "server_error" and body["request_id"] == "trace-me-500"
    assert "trace-me-500" in body["detail"] and response["X-Request-ID"] == "trace-me-500"
    log = _log_text()
    assert "[trace-me-500] RuntimeError in GET /api/v1/market/capacity" in log
    assert 'raise RuntimeError("capacity exploded")' in log  # the traceback reached the file


def test_a_web_page_error_is_a_500_naming_its_request_id_and_logged(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("market page exploded")

    monkeypatch.setattr("marketplace.web.views.public.market_capacity", broken)
    response = Client(raise_request_exception=False).get("/", HTTP_X_REQUEST_ID="trace-web")
    assert response.status_code == 500
    assert response.json()["request_id"] == "trace-web" == response["X-Request-ID"]
    log = _log_text()
    assert "[trace-web] Internal Server Error: /" in log
    assert 'raise RuntimeError("market page exploded")' in log


def test_a_4xx_is_logged_with_its_request_id(buyer: APIClient) -> None:
    buyer.get("/api/v1/jobs/?limit=abc", HTTP_X_REQUEST_ID="trace-me-400")
    assert "[trace-me-400] Bad Request: /api/v1/jobs/" in _log_text()


def test_the_log_goes_to_stderr_and_a_file_under_the_data_dir() -> None:
    handlers = {type(h).__name__: h for h in logging.getLogger("marketplace").handlers}
    assert {"StderrHandler", "WatchedFileHandler"} <= handlers.keys()
    # the stderr of the moment: a test runner swaps and closes the one logging first saw
    assert handlers["StderrHandler"].stream is sys.stderr
    assert Path(handlers["WatchedFileHandler"].baseFilename).is_relative_to(settings.DATA_DIR)


# -- the schema tells the truth ---------------------------------------------------------------


@pytest.fixture
def schema(db: None) -> dict[str, Any]:
    response = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    return response.json()


def test_payout_batch_id_is_nullable_in_the_schema(schema: dict[str, Any]) -> None:
    assert schema["components"]["schemas"]["Payout"]["properties"]["batch_id"]["nullable"]


def test_every_operation_documents_its_error_answers(schema: dict[str, Any]) -> None:
    error = {"$ref": "#/components/schemas/Error"}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert {"401", "403", "429"} <= responses.keys(), (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
            if method in ("post", "put", "patch"):
                assert "400" in responses, (method, path)
            for code, response in responses.items():
                if code.startswith("4"):
                    assert response["content"]["application/json"]["schema"] == error
    jobs = schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]
    assert {p["name"]: p["schema"].get("minimum") for p in jobs} == {
        "limit": 1,
        "offset": 0,
        "id_prefix": None,  # the short id `gpuflex` resolves
    }
    earnings = schema["paths"]["/api/v1/ledger/earnings"]["get"]["parameters"]
    assert earnings[0]["name"] == "days" and earnings[0]["schema"]["maximum"] == 366


def test_the_spec_is_still_accepted(submit: Callable[..., dict[str, Any]]) -> None:
    assert submit(SMALL_SPEC)["status"]


# -- #38 finding 8: the 500s a second probe found ----------------------------------------

HUGE_INT = "9" * 5000  # past Python's int-from-text digit limit (4,300)


def test_a_5000_digit_number_in_the_metrics_header_is_a_400(
    make_agent: Callable[..., Any], submit: Callable[..., dict[str, Any]]
) -> None:
    agent = make_agent()
    submit()
    task = agent.claim()
    assert task is not None
    response = agent.client.put(
        f"/api/v1/agent/tasks/{task['id']}/update",
        data=b"not read",
        content_type="application/octet-stream",
        HTTP_X_GPUFLEX_METRICS=f'{{"loss": {HUGE_INT}}}',
    )
    assert response.status_code == 400, response.content
    assert "X-GPUFlex-Metrics" in response.json()["detail"]
    assert "digits" in response.json()["detail"]


def _spec_text_with_seed(seed: str) -> str:
    import yaml

    return yaml.safe_dump({k: v for k, v in SMALL_SPEC.items() if k != "seed"}) + f"seed: {seed}\n"


def test_a_5000_digit_seed_in_a_multipart_spec_is_a_400(buyer: APIClient) -> None:
    body = {"spec": _spec_text_with_seed(HUGE_INT), "budget": "1", "max_price_per_gpu_hour": "1"}
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_spec"
    assert "digits" in response.json()["detail"]
    # any value YAML's constructors fail on (an impossible date) is the same kind of 400
    body["spec"] = _spec_text_with_seed("2024-13-01")
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert response.status_code == 400 and "month must be in 1..12" in response.json()["detail"]
    # the same in a JSON body was a 400 already
    json_body = f'{{"budget": "1", "max_price_per_gpu_hour": "1", "spec": {{"seed": {HUGE_INT}}}}}'
    assert post_json(buyer, "/api/v1/jobs/", json_body).status_code == 400


def test_a_5000_digit_seed_in_the_web_form_is_a_400(db: None) -> None:
    user = create_user("webseed", "buyer", "")
    web = Client()
    web.force_login(user)
    form = {
        "spec": _spec_text_with_seed(HUGE_INT),
        "tier": "hybrid",
        "budget": "1",
        "max_price_per_gpu_hour": "1",
    }
    page = web.post("/jobs/new/", form)
    assert page.status_code == 400, page.content[:500]
    assert "digits" in page.content.decode()


def test_options_on_an_upload_is_not_a_500(buyer: APIClient) -> None:
    body = {"filename": "d.csv", "size": 10, "sha256": "0" * 64}
    upload = buyer.post("/api/v1/uploads/", body, format="json").json()
    response = buyer.options(f"/api/v1/uploads/{upload['id']}/")
    assert response.status_code == 200, response.content
    assert "PUT" in response.json()["actions"]
    # someone else's, or no such upload: described without PUT, still no 500
    response = buyer.options("/api/v1/uploads/00000000-0000-0000-0000-000000000000/")
    assert response.status_code == 200, response.content
    assert "PUT" not in response.json().get("actions", {})


def test_the_key_limit_conflict_is_documented(schema: dict[str, Any]) -> None:
    responses = schema["paths"]["/api/v1/keys/"]["post"]["responses"]
    assert "409" in responses
    assert responses["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
