"""A claim re-sent with its Idempotency-Key (its first answer lost: the server died as it
answered, the connection dropped) is answered with what the first one leased, and nothing
more is leased: no lease waits out its timeout leased to a node that never heard of it."""

from __future__ import annotations

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from marketplace.rounds.models import Task
from tests.marketplace.helpers import SMALL_SPEC

SPEC = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 12}}


def _claim(agent, key: str | None, count: int = 1):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return agent.client.post(f"/api/v1/agent/claim?max={count}", **headers)


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [t["id"] for t in response.json()["tasks"]]


def _leased(agent) -> set[str]:
    return {str(pk) for pk in Task.objects.filter(node_id=agent.node_id, status="leased")
            .values_list("pk", flat=True)}  # fmt: skip


def _again() -> float:
    return REGISTRY.get_sample_value("gpuflex_claims_total", {"outcome": "again"}) or 0


@pytest.fixture(params=["row locks", "compare-and-set"])
def paths(request, monkeypatch):
    """Both claim paths: PostgreSQL's (the key's lookup in the claim's first statement) and
    the one without row locks that SQLite takes (a query of its own)."""
    if request.param == "compare-and-set":
        monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    return request.param


def test_a_resent_claim_gets_the_tasks_it_leased_and_leases_nothing_more(
    make_agent, submit, paths
) -> None:
    agent = make_agent()
    submit(SPEC)
    first = _ids(_claim(agent, "claim-key-0001", count=3))
    assert len(first) == 3 and _leased(agent) == set(first)
    before = _again()
    again = _claim(agent, "claim-key-0001", count=3)
    assert sorted(_ids(again)) == sorted(first)
    assert _leased(agent) == set(first)  # nothing more leased
    assert all(t.attempts == 1 for t in Task.objects.filter(pk__in=first))  # not leased anew
    assert _again() == before + 1
    # the answer is the one a claim gives: lease terms and payloads for each task
    task = again.json()["task"]
    assert task["steps"] and task["batch_size"] and task["spec"] and task["model_source"]


def test_a_new_key_is_a_new_claim(make_agent, submit, paths) -> None:
    agent = make_agent()
    submit(SPEC)
    first = _ids(_claim(agent, "claim-key-0001"))
    second = _ids(_claim(agent, "claim-key-0002"))
    assert set(first).isdisjoint(second) and _leased(agent) == set(first + second)
    third = _ids(_claim(agent, None))  # no key: a claim as before
    assert _leased(agent) == set(first + second + third)


def test_a_key_answers_only_while_its_tasks_are_still_leased_to_that_node(
    make_agent, submit, paths
) -> None:
    agent, other = make_agent(), make_agent()
    submit(SPEC)
    [first] = _ids(_claim(agent, "claim-key-0001"))
    # another node's claim with the same key is its own claim
    [theirs] = _ids(_claim(other, "claim-key-0001"))
    assert theirs != first and _leased(other) == {theirs}
    # the task given back (failed), the key leases afresh: the released task is not answered
    response = agent.client.post(
        f"/api/v1/agent/tasks/{first}/fail", {"reason": "cancelled", "detail": "t"}, format="json"
    )
    assert response.status_code in (200, 204), response.content
    [after] = _ids(_claim(agent, "claim-key-0001"))
    task = Task.objects.get(pk=after)
    assert task.status == "leased" and task.node_id == agent.node_id
    assert task.claim_key == "claim-key-0001"
    assert after != first or task.attempts == 2  # a new lease, not the old answer


def test_a_lease_the_server_made_on_its_own_has_no_key(make_agent, submit, paths) -> None:
    agent = make_agent()
    submit(SPEC)
    [tid] = _ids(_claim(agent, None))
    assert Task.objects.get(pk=tid).claim_key is None


@pytest.mark.parametrize("bad", ["short", "x" * 65, "has space!", "ünïcode-key"])
def test_a_malformed_key_is_a_400_that_names_the_header(make_agent, submit, bad) -> None:
    agent = make_agent()
    submit(SPEC)
    response = _claim(agent, bad)
    assert response.status_code == 400, response.content
    assert "Idempotency-Key" in response.content.decode()
    assert not _leased(agent)
