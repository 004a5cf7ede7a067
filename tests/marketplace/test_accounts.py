from __future__ import annotations

import pytest
from django.core.management import call_command

from marketplace.accounts.models import ApiKey
from tests.marketplace.helpers import client_for


def test_keys_are_stored_hashed_and_shown_once(buyer, make_user) -> None:
    user, key = make_user("buyer")
    stored = ApiKey.objects.get(user=user)
    assert key.startswith("gfx_u_")
    assert key not in (stored.digest, stored.prefix)
    assert not ApiKey.objects.filter(digest=key).exists()
    listed = client_for(key).get("/api/v1/keys/").json()["results"]
    assert [k["prefix"] for k in listed] == [stored.prefix]
    assert "key" not in listed[0]


def test_revoked_key_gets_401(make_user) -> None:
    _, key = make_user("buyer")
    client = client_for(key)
    created = client.post("/api/v1/keys/", {"name": "ci"}, format="json").json()
    other = client_for(created["key"])
    assert other.get("/api/v1/jobs/").status_code == 200
    assert client.delete(f"/api/v1/keys/{created['id']}").status_code == 204
    response = other.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response.json()["error"] == "authentication_failed"


@pytest.mark.parametrize("header", ["Bearer gfx_u_wrong", "Bearer nonsense", "Token abc", "Bearer"])
def test_wrong_keys_get_401_with_error_body(db, header: str) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 401
    body = response.json()
    assert set(body) == {"error", "detail"} and body["detail"]


def test_no_key_gets_401(db) -> None:
    from rest_framework.test import APIClient

    response = APIClient().get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_cannot_revoke_another_users_key(make_user) -> None:
    _, mine = make_user("buyer")
    other_user, _ = make_user("buyer")
    theirs = ApiKey.objects.get(user=other_user)
    assert client_for(mine).delete(f"/api/v1/keys/{theirs.pk}").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_create_account_command_prints_a_working_key(db, capsys) -> None:
    call_command("create_account", "alice", "--role", "provider")
    key = capsys.readouterr().out.strip()
    assert key.startswith("gfx_u_")
    assert client_for(key).get("/api/v1/nodes/").status_code == 200
