"""The task field `overlap`: a node may train on while its update uploads and merge that
progress into its next task only where the job asks for it and the unit is not replicated."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from marketplace.rounds.models import Task
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def _spec(**adaptation: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2,
                          **adaptation}  # fmt: skip
    return spec


def test_an_overlap_job_on_platform_nodes_allows_it(make_agent, submit) -> None:
    submit(spec=_spec(overlap=True), tier="platform")
    task = make_agent(kind="platform").claim()
    assert task is not None and task["overlap"] is True


@pytest.mark.parametrize("adaptation", [None, {"overlap": False}])
def test_jobs_that_do_not_ask_for_it_never_get_it(make_agent, submit, adaptation) -> None:
    spec = SMALL_SPEC if adaptation is None else _spec(**adaptation)
    submit(spec=spec, tier="platform")
    task = make_agent(kind="platform").claim()
    assert task is not None and task["overlap"] is False


def test_a_replicated_unit_never_overlaps(make_agent, submit) -> None:
    """An untrusted volunteer's task is replicated for verification: both copies are compared
    bit for bit, so neither may carry the node's merged progress."""
    submit(spec=_spec(overlap=True))
    first = make_agent().claim()
    assert first is not None
    db = Task.objects.get(pk=first["id"])
    assert Task.objects.filter(round=db.round, shard=db.shard, replica__gt=0).exists()
    assert first["overlap"] is False
    replica = make_agent(kind="platform").claim()  # platform nodes take replicas first
    assert replica is not None and replica["overlap"] is False
    assert Task.objects.get(pk=replica["id"]).replica > 0
