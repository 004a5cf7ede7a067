"""Every web page with Django's test client: who may open it, its forms and its JSON."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from marketplace.accounts.models import User
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from tests.marketplace.helpers import SMALL_SPEC
from tests.web.conftest import PASSWORD, agent_for, run_until_idle

pytestmark = pytest.mark.django_db
JSON = {"HTTP_ACCEPT": "application/json"}


def _spec_text(**changes) -> str:
    return yaml.safe_dump(SMALL_SPEC | changes, sort_keys=False)


# -- public -------------------------------------------------------------------------------


def test_market_shows_online_capacity_to_anyone(make_user, make_node) -> None:
    provider = make_user("provider")
    make_node(provider, price="0.35")
    make_node(provider, price="0.55")
    page = Client().get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "RTX 4090" in html and "0.3500 – 0.5500" in html
    assert 'id="m-nodes">2<' in html


def test_signup_creates_a_user_with_a_password_and_logs_in() -> None:
    client = Client()
    body = {"username": "ada", "email": "ada@example.com", "role": "provider",
            "password": PASSWORD}  # fmt: skip
    response = client.post("/signup/", body)
    assert response.status_code == 302 and response["Location"] == "/nodes/"
    user = User.objects.get(username="ada")
    assert user.role == "provider" and user.check_password(PASSWORD)
    assert client.get("/nodes/").status_code == 200  # logged in by the session


def test_signup_rejects_taken_names_weak_passwords_and_operator_role(make_user) -> None:
    taken = make_user("buyer")
    for body, field in [
        ({"username": taken.username, "role": "buyer", "password": PASSWORD}, "taken"),
        ({"username": "bob", "role": "buyer", "password": "123"}, "too short"),
        ({"username": "eve", "role": "operator", "password": PASSWORD}, "valid choice"),
    ]:
        response = Client().post("/signup/", body)
        assert response.status_code == 200 and field in response.content.decode()
    assert not User.objects.filter(username__in=["bob", "eve"]).exists()


def test_login_and_logout(make_user) -> None:
    buyer = make_user("buyer")
    client = Client()
    bad = client.post("/login/", {"username": buyer.username, "password": "wrong"})
    assert bad.status_code == 200 and "correct username and password" in bad.content.decode()
    good = client.post("/login/", {"username": buyer.username, "password": PASSWORD})
    assert good.status_code == 302 and good["Location"] == "/jobs/"
    assert client.post("/logout/").status_code == 302
    assert client.get("/jobs/").status_code == 302  # back to the login page


def test_comparison_page_charts_the_benchmark() -> None:
    page = Client().get("/compare/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Network-aware" in html and 'id="compare-data"' in html


def test_static_files_are_served_without_a_web_server() -> None:
    response = Client().get("/static/web/vendor/uPlot.iife.min.js")
    assert response.status_code == 200


# -- who may open what -------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/jobs/", "/jobs/new/", "/nodes/", "/earnings/", "/operator/"])
def test_pages_need_a_login(url: str) -> None:
    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize(
    ("role", "url", "status"),
    [
        ("provider", "/jobs/", 403),
        ("provider", "/jobs/new/", 403),
        ("buyer", "/nodes/", 403),
        ("buyer", "/earnings/", 403),
        ("buyer", "/operator/", 403),
        ("provider", "/operator/", 403),
        ("operator", "/jobs/", 200),
        ("operator", "/nodes/", 200),
        ("operator", "/operator/", 200),
        ("buyer", "/keys/", 200),
    ],
)
def test_roles(make_user, login, role: str, url: str, status: int) -> None:
    assert login(make_user(role)).get(url).status_code == status


def test_a_buyer_cannot_open_another_buyers_job(make_user, login, make_job) -> None:
    owner, other = make_user("buyer"), make_user("buyer")
    job = make_job(owner)
    stranger = login(other)
    for url in [f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/", f"/jobs/{job.pk}/model/",
                f"/jobs/{job.pk}/provenance/"]:  # fmt: skip
        assert stranger.get(url).status_code == 404, url
    assert stranger.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert Job.objects.get(pk=job.pk).status == "running"
    assert job.name not in stranger.get("/jobs/").content.decode()
    assert login(owner).get(f"/jobs/{job.pk}/").status_code == 200
    assert login(make_user("operator")).get(f"/jobs/{job.pk}/").status_code == 200


def test_a_provider_sees_only_own_nodes(make_user, login, make_node) -> None:
    mine, theirs = make_user("provider"), make_user("provider")
    a, b = make_node(mine), make_node(theirs)
    html = login(mine).get("/nodes/").content.decode()
    assert a.name in html and b.name not in html
    response = login(mine).post(f"/nodes/{b.pk}/price/", {f"n{b.pk}-price_per_gpu_hour": "9"})
    assert response.status_code == 404
    assert str(Node.objects.get(pk=b.pk).price_per_gpu_hour) == "0.4000"


# -- buyer ---------------------------------------------------------------------------------


def test_estimate_endpoint_shows_problems_with_lines(make_user, login) -> None:
    client = login(make_user("buyer"))
    text = _spec_text(local={"steps": 0, "batch_size": 32})
    data = client.post("/jobs/estimate/", {"spec": text}).json()
    assert data["ok"] is False
    [problem] = data["problems"]
    assert problem["field"].startswith("local") and problem["line"] is not None
    assert text.splitlines()[problem["line"] - 1].strip().startswith(("local", "steps"))
    bad_yaml = client.post("/jobs/estimate/", {"spec": "name: [unclosed"}).json()
    assert bad_yaml["ok"] is False and bad_yaml["problems"][0]["field"] == "<file>"


def test_estimate_endpoint_prices_from_online_nodes(make_user, login, make_node) -> None:
    provider = make_user("provider")
    make_node(provider, price="0.40")
    make_node(provider, price="5.00")  # over the cap below
    client = login(make_user("buyer"))
    body = {"spec": _spec_text(), "tier": "platform", "max_price_per_gpu_hour": "1.00"}
    data = client.post("/jobs/estimate/", body).json()
    assert data["ok"] is True and data["dataset"] == "digits" and not data["needs_upload"]
    est = data["estimate"]
    assert est["nodes"] == 1 and est["price_low"] == est["price_high"] == "0.4000"
    assert float(est["cost"]) > 0 and est["seconds"] > 0
    body["max_price_per_gpu_hour"] = "0.10"
    assert client.post("/jobs/estimate/", body).json()["estimate"] is None


def test_submit_form_creates_the_job_and_goes_to_its_page(make_user, login) -> None:
    buyer = make_user("buyer")
    body = {"spec": _spec_text(), "tier": "hybrid", "budget": "5",
            "max_price_per_gpu_hour": "1.00"}  # fmt: skip
    response = login(buyer).post("/jobs/new/", body)
    job = Job.objects.get(buyer=buyer)
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.name == "digits-small" and str(job.budget) == "5.0000"


def test_submit_by_xhr_answers_json(make_user, login) -> None:
    client = login(make_user("buyer"))
    body = {"spec": _spec_text(), "tier": "platform", "budget": "5",
            "max_price_per_gpu_hour": "1.00"}  # fmt: skip
    ok = client.post("/jobs/new/", body, **JSON)
    assert ok.status_code == 201 and ok.json()["redirect"].startswith("/jobs/")
    bad = client.post("/jobs/new/", body | {"spec": _spec_text(rounds={"max_rounds": 0})}, **JSON)
    data = bad.json()
    assert bad.status_code == 400 and data["problems"][0]["field"] == "rounds.max_rounds"
    assert data["problems"][0]["line"] is not None
    missing = client.post("/jobs/new/", body | {"budget": ""}, **JSON).json()
    assert "budget" in missing["fields"]


def test_submit_shows_problems_inline_without_javascript(make_user, login) -> None:
    client = login(make_user("buyer"))
    body = {"spec": _spec_text(model={"arch": "nope"}), "tier": "hybrid", "budget": "5",
            "max_price_per_gpu_hour": "1.00"}  # fmt: skip
    response = client.post("/jobs/new/", body)
    assert response.status_code == 400
    html = response.content.decode()
    assert "model.arch" in html and 'class="problems"' in html


def test_submit_reports_dataset_and_credit_errors(make_user, login) -> None:
    buyer = make_user("buyer", credit="1")
    client = login(buyer)
    body = {"spec": _spec_text(), "tier": "hybrid", "budget": "5",
            "max_price_per_gpu_hour": "1.00"}  # fmt: skip
    poor = client.post("/jobs/new/", body, **JSON).json()
    assert poor["ok"] is False and "credit" in poor["error"].lower()
    upload = SimpleUploadedFile("d.csv", b"a,label\n1,0\n", content_type="text/csv")
    built_in = client.post("/jobs/new/", body | {"budget": "1", "dataset": upload}, **JSON).json()
    assert "built in" in built_in["error"]
    assert not Job.objects.filter(buyer=buyer).exists()


def test_job_page_and_live_json(make_user, login, make_job) -> None:
    buyer = make_user("buyer")
    job = make_job(buyer)
    client = login(buyer)
    page = client.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="live-data"' in html and "Pause" in html and "no rounds yet" in html
    live = client.get(f"/jobs/{job.pk}/live/").json()
    assert live["status"] == "running" and live["max_rounds"] == 2
    assert live["rounds"][0]["number"] == 1 and live["rounds"][0]["accuracy"] is None
    assert live["cost"]["available"] is True and float(live["cost"]["budget"]) == 10
    assert live["nodes"] == [] and live["has_model"] is False


def test_pause_resume_cancel(make_user, login, make_job) -> None:
    buyer = make_user("buyer")
    job = make_job(buyer)
    client = login(buyer)
    for action, status in [("pause", "paused"), ("resume", "running"), ("cancel", "cancelled")]:
        response = client.post(f"/jobs/{job.pk}/{action}/")
        assert response.status_code == 302
        assert Job.objects.get(pk=job.pk).status == status
    again = client.post(f"/jobs/{job.pk}/pause/", follow=True)
    assert "Only a running job can be paused" in again.content.decode()
    assert client.post(f"/jobs/{job.pk}/explode/").status_code == 404
    assert client.get(f"/jobs/{job.pk}/pause/").status_code == 405


def test_model_download_before_any_round_explains(make_user, login, make_job) -> None:
    buyer = make_user("buyer")
    job = make_job(buyer)
    response = login(buyer).get(f"/jobs/{job.pk}/model/", follow=True)
    assert "no model to download" in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_finished_job_shows_rounds_nodes_provenance_and_model(
    make_user, login, make_node, make_job
) -> None:
    provider = make_user("provider")
    agents = [agent_for(make_node(provider, rtt_ms=rtt)) for rtt in (20.0, 200.0)]
    buyer = make_user("buyer")
    job = make_job(buyer)
    assert run_until_idle(agents) == 6
    client = login(buyer)
    live = client.get(f"/jobs/{job.pk}/live/").json()
    assert live["status"] == "completed" and live["has_model"]
    assert [r["status"] for r in live["rounds"]] == ["done", "done"]
    assert all(0 <= r["accuracy"] <= 1 and r["loss"] > 0 for r in live["rounds"])
    nodes = {n["rtt_ms"]: n for n in live["nodes"]}
    assert nodes[20.0]["band"] == "good" and nodes[200.0]["band"] == "poor"
    assert abs(sum(n["share"] for n in live["nodes"]) - 1) < 1e-3
    assert all(0 < n["health"] <= 1 for n in live["nodes"])
    assert float(live["cost"]["spent"]) > 0
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "chain verified" in page
    model = client.get(f"/jobs/{job.pk}/model/")
    assert (
        model.status_code == 200
        and model["X-GPUFlex-Model-Hash"] == job.__class__.objects.get(pk=job.pk).model_hash
    )
    chain = json.loads(client.get(f"/jobs/{job.pk}/provenance/").content)
    assert len(chain["records"]) == 2
    # the provider's side of the same work
    provider_client = login(provider)
    earned = provider_client.get("/earnings/live/").json()
    assert earned["tasks_done"] == 6 and float(earned["balances"]["earnings"]) > 0
    assert sum(float(r["amount"]) for r in earned["by_node"]) > 0
    nodes_page = provider_client.get("/nodes/").content.decode()
    cells = re.findall(r'data-testid="tasks-done">(\d+)<', nodes_page)
    assert sum(map(int, cells)) == 6
    operator = login(make_user("operator")).get("/operator/").content.decode()
    assert 'data-testid="heatmap"' in operator and "Balanced" in operator


# -- provider ------------------------------------------------------------------------------


def test_provider_edits_a_price(make_user, login, make_node) -> None:
    provider = make_user("provider")
    node = make_node(provider)
    client = login(provider)
    field = f"n{node.pk}-price_per_gpu_hour"
    response = client.post(f"/nodes/{node.pk}/price/", {field: "0.75"}, follow=True)
    assert "now asks 0.75" in response.content.decode()
    assert str(Node.objects.get(pk=node.pk).price_per_gpu_hour) == "0.7500"
    bad = client.post(f"/nodes/{node.pk}/price/", {field: "-1"}, follow=True)
    assert "greater than or equal to 0" in bad.content.decode()


def test_payout_form_validates_and_reports_ledger_errors(make_user, login) -> None:
    client = login(make_user("provider"))
    page = client.get("/earnings/")
    assert page.status_code == 200 and "Request a payout" in page.content.decode()
    wallet = "0x" + "ab" * 20
    bad = client.post("/earnings/", {"amount": "1", "wallet_address": "nope",
                                     "idempotency_key": "k1"})  # fmt: skip
    assert "0x followed by 40 hex digits" in bad.content.decode()
    broke = client.post("/earnings/", {"amount": "5", "wallet_address": wallet,
                                       "idempotency_key": "k2"})  # fmt: skip
    assert broke.status_code == 200 and 'class="alert"' in broke.content.decode()


def test_api_keys_are_shown_once_and_revocable(make_user, login) -> None:
    user = make_user("provider")
    client = login(user)
    created = client.post("/keys/", {"name": "laptop"}).content.decode()
    assert "gfx_u_" in created
    key = user.api_keys.get()
    client.post("/keys/", {"revoke": key.pk})
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert "gfx_u_" not in client.get("/keys/").content.decode().replace(key.prefix, "")


def test_the_job_page_says_what_confined_its_tasks() -> None:
    """Full isolation required, or which nodes had limits only (no network or file isolation)."""
    from types import SimpleNamespace

    from marketplace.web.jobview import sandbox_note

    rows = [{"name": "linux-box", "isolation": "full"}, {"name": "win-box", "isolation": "limits"},
            {"name": "old-agent", "isolation": "unknown"}]  # fmt: skip
    assert sandbox_note(SimpleNamespace(isolation_full=True), rows).startswith(
        "Full isolation required"
    )
    note = sandbox_note(SimpleNamespace(isolation_full=False), rows)
    assert "Limits only on 2 of 3 nodes (win-box, old-agent)" in note
    assert "isolation: full" in note
    assert "confines its tasks" in sandbox_note(SimpleNamespace(isolation_full=False), rows[:1])
