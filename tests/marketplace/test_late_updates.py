"""Late updates (spec rounds.late_updates): work still in flight when its round closes on
quorum is folded into a later round with a staleness weight (FedBuff), or dropped."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.ledger.reconcile import reconcile
from marketplace.rounds.aggregation import artifact_store
from marketplace.rounds.models import Round, Task, TaskResult
from tests.marketplace.helpers import SMALL_SPEC
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.rounds import staleness_weight
from trainer.spec import parse_spec
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)


def _spec(late: str, max_rounds: int = 3) -> dict[str, Any]:
    # two shards, closing on one: the second shard's task is still out when round 1 closes
    return SMALL_SPEC | {
        "rounds": {"max_rounds": max_rounds, "quorum": 0.5, "late_updates": late},
        "sharding": {"method": "stratified", "num_shards": 2},
    }


def test_a_late_update_is_folded_into_the_next_round_with_a_weight(make_agent, submit, buyer):
    fast, slow = make_agent(kind="platform"), make_agent(kind="platform")
    job = submit(_spec("stale"), tier="platform", budget="10")
    quick, straggler = fast.claim(), slow.claim()
    assert fast.work(quick).status_code == 202  # quorum: round 1 closes, round 2 opens
    one = Round.objects.get(job_id=job["id"], number=1)
    assert one.status == "done" and one.metrics["participants"] == 1
    assert Task.objects.get(pk=straggler["id"]).status == "leased"  # kept in flight

    assert slow.work(straggler).status_code == 202  # after its round closed: late, kept
    late = TaskResult.objects.get(task_id=straggler["id"])
    assert late.late and not late.aggregated and late.accepted

    assert fast.work(fast.claim()).status_code == 202  # round 2 closes and folds it in
    two = Round.objects.get(job_id=job["id"], number=2)
    assert two.metrics["late_folded"] == 1 and two.metrics["participants"] == 2
    late.refresh_from_db()
    assert late.aggregated and late.credited  # folded, and paid for
    # provenance replays round 2 with the late update at its staleness weight
    chain = ProvenanceChain.from_json(buyer.get(f"/api/v1/jobs/{job['id']}/provenance").content)
    spec = parse_spec(Job.objects.get(pk=job["id"]).spec)
    assert verify_with_artifacts(chain, artifact_store(), spec.aggregation).ok
    assert [c.node_id for c in chain.records[1].contributions] == [
        str(fast.node_id),
        str(slow.node_id),
    ]
    folded = artifact_store().get_state(chain.records[1].contributions[1].update_hash)
    sent, _ = decode_state(files.get(late.update_file))
    for name, tensor in sent.items():  # one round stale: 1/sqrt(2) of what the node sent
        assert torch.allclose(folded[name], tensor * staleness_weight(1))
    assert staleness_weight(1) == pytest.approx(2**-0.5)
    assert reconcile(with_chain=False).ok


def test_late_updates_dropped_when_the_spec_says_so(make_agent, submit) -> None:
    fast, slow = make_agent(kind="platform"), make_agent(kind="platform")
    submit(_spec("drop"), tier="platform")
    quick, straggler = fast.claim(), slow.claim()
    assert fast.work(quick).status_code == 202
    assert Task.objects.get(pk=straggler["id"]).status == "cancelled"
    response = slow.work(straggler)
    assert response.status_code == 409 and "cancelled" in response.json()["detail"]


def test_work_in_flight_when_the_job_ends_is_cancelled(make_agent, submit) -> None:
    fast, slow = make_agent(kind="platform"), make_agent(kind="platform")
    job = submit(_spec("stale", max_rounds=1), tier="platform")
    quick, straggler = fast.claim(), slow.claim()
    assert fast.work(quick).status_code == 202
    assert Job.objects.get(pk=job["id"]).status == "completed"
    assert Task.objects.get(pk=straggler["id"]).status == "cancelled"
    assert slow.work(straggler).status_code == 409
