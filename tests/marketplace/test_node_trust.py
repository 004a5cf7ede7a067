"""#20 finding 1: trust boundaries. A provider's node is a volunteer; a platform node is
enrolled by an operator (a hashed, limited enrollment token), and its results are still
spot-checked at the rate the operator sets."""

from __future__ import annotations

import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from marketplace.jobs.models import Job
from marketplace.nodes.enrollment import create_enrollment_token
from marketplace.nodes.models import EnrollmentToken, Node
from marketplace.rounds.models import Task, TaskResult
from marketplace.rounds.scheduling import spot_draw
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC, client_for

pytestmark = pytest.mark.django_db(transaction=True)


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "name": "n",
        "kind": "platform",
        "hardware": HARDWARE,
        "price_per_gpu_hour": "0.40",
    } | extra


def test_a_provider_cannot_register_a_platform_node(provider: APIClient) -> None:
    """Before: any provider's `kind: platform` was taken, its work never replicated."""
    response = provider.post("/api/v1/nodes/", _body(), format="json")
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["error"] == "enrollment_required" and body["field"] == "enrollment_token"
    assert "enrollment_token" in body["detail"]
    forged = provider.post("/api/v1/nodes/", _body(enrollment_token="gfx_e_guess"), format="json")
    assert forged.status_code == 403 and forged.json()["field"] == "enrollment_token"
    assert not Node.objects.exists()


def test_a_registration_without_a_kind_is_a_volunteer(provider: APIClient) -> None:
    body = _body()
    del body["kind"]
    response = provider.post("/api/v1/nodes/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "volunteer"


def test_an_operator_token_enrolls_a_limited_number_of_platform_nodes(make_user) -> None:
    _, operator_key = make_user("operator")
    _, provider_key = make_user("provider")
    operator, provider = client_for(operator_key), client_for(provider_key)
    assert provider.post("/api/v1/operator/enrollment-tokens", {}, format="json").status_code == 403
    made = operator.post(
        "/api/v1/operator/enrollment-tokens", {"uses": 2, "memo": "rack 4"}, format="json"
    )
    assert made.status_code == 201, made.content
    token = made.json()["enrollment_token"]
    assert token.startswith("gfx_e_") and made.json()["uses_left"] == 2
    # stored hashed: the plaintext is in no column of the row
    row = EnrollmentToken.objects.get()
    assert token not in str(list(EnrollmentToken.objects.values_list()))
    assert row.digest != token and row.created_by.role == "operator"

    for name in ("p1", "p2"):
        response = provider.post(
            "/api/v1/nodes/", _body(name=name, enrollment_token=token), format="json"
        )
        assert response.status_code == 201, response.content
        assert response.json()["kind"] == "platform"
        assert "enrollment_token" not in response.json()
    used_up = provider.post(
        "/api/v1/nodes/", _body(name="p3", enrollment_token=token), format="json"
    )
    assert used_up.status_code == 403 and "used up" in used_up.json()["detail"]
    assert sorted(Node.objects.values_list("name", flat=True)) == ["p1", "p2"]
    assert all(n.enrolled_with_id == row.pk for n in Node.objects.all())


def test_a_refused_registration_does_not_use_the_token(provider: APIClient) -> None:
    token, plaintext = create_enrollment_token(operator=None)
    bad = _body(enrollment_token=plaintext, hardware={"memory_gb": "lots"})
    assert provider.post("/api/v1/nodes/", bad, format="json").status_code == 400
    token.refresh_from_db()
    assert token.uses_left == 1 and not Node.objects.exists()


def test_an_expired_or_revoked_token_enrolls_nothing(provider: APIClient) -> None:
    revoked, plaintext = create_enrollment_token(operator=None)
    EnrollmentToken.objects.filter(pk=revoked.pk).update(revoked_at="2020-01-01T00:00:00Z")
    response = provider.post("/api/v1/nodes/", _body(enrollment_token=plaintext), format="json")
    assert response.status_code == 403
    expired, plaintext = create_enrollment_token(operator=None, expires_in_s=60)
    EnrollmentToken.objects.filter(pk=expired.pk).update(expires_at="2020-01-01T00:00:00Z")
    response = provider.post("/api/v1/nodes/", _body(enrollment_token=plaintext), format="json")
    assert response.status_code == 403 and not Node.objects.exists()


def test_the_operator_command_makes_a_token_the_demo_enrolls_with(provider: APIClient) -> None:
    """`gpuflex manage create_enrollment_token` is what the demo cluster (and the system
    tests' harness) runs for each platform node it starts."""
    out = StringIO()
    call_command("create_enrollment_token", "--uses", "1", stdout=out)
    token = out.getvalue().strip()
    response = provider.post("/api/v1/nodes/", _body(enrollment_token=token), format="json")
    assert response.status_code == 201 and response.json()["kind"] == "platform"


def test_the_spot_check_draw_is_keyed_deterministic_and_uniform() -> None:
    ids = [uuid.UUID(int=i) for i in range(4000)]
    draws = [spot_draw(i) for i in ids]
    assert draws == [spot_draw(i) for i in ids]
    assert all(0 <= d < 1 for d in draws)
    share = sum(d < 0.05 for d in draws) / len(draws)
    assert 0.035 < share < 0.065, share


def _platform_job(submit) -> dict[str, Any]:
    spec = SMALL_SPEC | {
        "sharding": {"method": "random", "num_shards": 1},
        "rounds": {"max_rounds": 1},
    }
    return submit(spec=spec, tier="platform")


def test_platform_results_are_not_replicated_when_the_rate_is_zero(
    make_agent, submit, settings
) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"PLATFORM_SPOT_CHECK_RATE": 0.0}
    node = make_agent(kind="platform")
    _platform_job(submit)
    assert node.claim() is not None
    assert not Task.objects.filter(replica__gt=0).exists()


def test_a_spot_checked_platform_cheat_is_outvoted_and_unpaid(make_agent, submit, settings) -> None:
    """Before: a platform node's random noise was credited unchecked. Now (the operator's
    rate at 1, so the check is certain) its task gets a replica like a volunteer's, and the
    dispute a third one: the majority rejects the noise."""
    settings.GPUFLEX = settings.GPUFLEX | {"PLATFORM_SPOT_CHECK_RATE": 1.0}
    cheater, honest, third = (make_agent(kind="platform") for _ in range(3))
    job = _platform_job(submit)
    task = cheater.claim()
    assert Task.objects.filter(replica=1).count() == 1, "the spot check added a replica"
    replica = honest.claim()
    assert replica is not None and replica["seed"] == task["seed"]
    assert cheater.work(task, cheat=True).status_code == 202
    assert honest.work(replica).status_code == 202
    tie_break = third.claim()
    assert tie_break is not None and tie_break["seed"] == task["seed"]
    assert third.work(tie_break).status_code == 202

    cheat = TaskResult.objects.get(node_id=cheater.node_id)
    assert cheat.verified is False and not cheat.accepted and not cheat.credited
    others = TaskResult.objects.exclude(pk=cheat.pk)
    assert others.count() == 2 and all(r.verified and r.credited for r in others)
    assert Node.objects.get(pk=cheater.node_id).verified_bad == 1
    assert Job.objects.get(pk=job["id"]).status in ("completed", "running")
