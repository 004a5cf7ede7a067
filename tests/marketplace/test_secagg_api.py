"""Secure aggregation's agent API, driven message by message (the protocol's node side from
trainer/secagg): a round with a node that drops after sharing completes on the survivors'
mean; plain updates, out-of-turn messages and unmask answers that would expose an input are
refused; and the spec refuses what cannot work on a masked sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marketplace.jobs.models import Job
from marketplace.jobs.models_io import load_model_file
from marketplace.rounds.models import Round, SecAggRound, Task, TaskResult
from tests.marketplace.test_federated import CLINIC, FEDERATED_SPEC, submit_federated
from trainer.secagg import field as gf
from trainer.secagg.protocol import Participant, Roster
from trainer.secagg.shamir import to_bytes
from trainer.secagg.vectors import encode_masked, flatten
from trainer.updates import decode_state, encode_state

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = FEDERATED_SPEC | {
    "rounds": {"max_rounds": 1, "quorum": 0.75},
    "privacy": {"secure_aggregation": {"enabled": True}},
}


def _url(task: dict, part: str = "") -> str:
    return f"/api/v1/agent/tasks/{task['id']}/secagg{part}"


def test_a_secure_round_over_the_api_survives_a_dropout(make_agent, buyer) -> None:
    silos = [make_agent(local_datasets=CLINIC) for _ in range(4)]
    job = submit_federated(buyer, spec=SPEC)
    tasks = [a.claim() for a in silos]
    nodes = [Participant() for _ in silos]
    # too early for shares: the roster is not fixed
    early = silos[0].client.get(_url(tasks[0], "/shares"))
    assert early.status_code == 409
    for a, t, p in zip(silos, tasks, nodes, strict=True):
        body = {"c_key": p.c.public.hex(), "s_key": p.s.public.hex()}
        assert a.client.post(_url(t), body, format="json").status_code == 200
    view = silos[0].client.get(_url(tasks[0])).json()
    assert view["phase"] == "share" and view["threshold"] == 3 and len(view["members"]) == 4
    roster = Roster(
        bytes.fromhex(view["context"]), view["threshold"],
        {m["index"]: bytes.fromhex(m["c_key"]) for m in view["members"]},
        {m["index"]: bytes.fromhex(m["s_key"]) for m in view["members"]},
    )  # fmt: skip
    index = {}
    for a, t, p in zip(silos, tasks, nodes, strict=True):
        index[t["id"]] = a.client.get(_url(t)).json()["index"]
        sealed = p.shares(roster, index[t["id"]])
        if a is silos[0]:  # one recipient short: refused, naming the field
            short = {str(k): v.hex() for k, v in list(sealed.items())[1:]}
            bad = a.client.post(_url(t, "/shares"), {"shares": short}, format="json")
            assert bad.status_code == 400 and bad.json()["field"] == "shares"
        body = {"shares": {str(k): v.hex() for k, v in sealed.items()}}
        assert a.client.post(_url(t, "/shares"), body, format="json").status_code == 200
    assert silos[0].client.get(_url(tasks[0])).json()["shared"] == [1, 2, 3, 4]
    for a, t, p in zip(silos, tasks, nodes, strict=True):
        got = a.client.get(_url(t, "/shares")).json()["shares"]
        p.receive({int(k): bytes.fromhex(v) for k, v in got.items()})

    state, _ = decode_state(silos[0].model(tasks[0]["id"]).content)
    rng = np.random.default_rng(0)
    plain = {t["id"]: {k: torch.from_numpy(rng.normal(0, 0.05, v.shape).astype(np.float32))
                       for k, v in state.items()} for t in tasks}  # fmt: skip
    metrics = {"loss": 1.0, "samples": 100}
    # a plain update is refused: the server takes masked field elements only
    refused = silos[0].upload(tasks[0]["id"], encode_state(plain[tasks[0]["id"]]), metrics)
    assert refused.status_code == 422 and refused.json()["reason"] == "secagg"
    clip = 8.0
    for a, t, p in list(zip(silos, tasks, nodes, strict=True))[:3]:  # the fourth drops out
        masked = p.mask(gf.quantize(flatten(plain[t["id"]]), 4, clip))
        assert a.upload(t["id"], encode_masked(masked, {}), metrics).status_code == 202
    sa = SecAggRound.objects.get(round__job_id=job["id"])
    assert (sa.phase, sa.survivors, sa.dropped) == ("unmask", [1, 2, 3], [4])
    # the dropped node's late masked input is received, then refused by the worker's check:
    # the survivors are fixed; its lease ends with the reason
    late = nodes[3].mask(gf.quantize(flatten(plain[tasks[3]["id"]]), 4, clip))
    assert silos[3].upload(tasks[3]["id"], encode_masked(late, {}), metrics).status_code == 202
    refused_late = Task.objects.get(pk=tasks[3]["id"])
    assert refused_late.node_id is None and not TaskResult.objects.filter(task=refused_late)
    assert refused_late.last_error.startswith("upload refused (conflict)")

    for a, t, p in list(zip(silos, tasks, nodes, strict=True))[:3]:
        replies = p.unmask([1, 2, 3], [4])
        body = {"shares": {str(u): [k, to_bytes(y).hex()] for u, (k, y) in replies.items()}}
        if a is silos[0]:  # asking to reveal a survivor's key share: refused
            wrong = {"shares": body["shares"] | {"1": ["s", body["shares"]["1"][1]]}}
            assert a.client.post(_url(t, "/unmask"), wrong, format="json").status_code == 400
        assert a.client.post(_url(t, "/unmask"), body, format="json").status_code == 200

    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed", done.error
    before = flatten(load_model_file(Round.objects.get(job=done, number=1).input_model_file))
    after = flatten(load_model_file(done.model_file))
    mean = np.mean([flatten(plain[t["id"]]) for t in tasks[:3]], axis=0)
    assert np.abs((after - before) - mean).max() <= 3 * gf.quantization_error(4, clip) + 1e-6


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"aggregation": {"strategy": "median"}}, "median"),
        ({"aggregation": {"strategy": "krum"}}, "krum"),
        ({"aggregation": {"strategy": "trimmed_mean"}}, "trimmed_mean"),
        ({"compression": {"codec": "topk"}}, "sparse"),
        ({"compression": {"codec": "int8"}}, "quantized into the field"),
        ({"rounds": {"late_updates": "stale"}}, "late"),
    ],
)
def test_the_spec_refuses_what_a_masked_sum_cannot_do(buyer, extra, named) -> None:
    spec = SPEC | extra
    body = {"spec": spec, "max_price_per_gpu_hour": "1", "budget": "10",
            "federated_dataset": "clinic", "tier": "volunteer"}  # fmt: skip
    response = buyer.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    problems = response.json()["problems"]
    assert any(p["field"] == "privacy" and named in p["reason"] for p in problems), problems


def test_a_round_whose_survivors_stop_answering_ends_the_job(make_agent, buyer) -> None:
    """Three survivors and a threshold of three: when one never sends its unmasking shares,
    the sum cannot be recovered without exposing someone, and the job fails saying so once
    setup_s has passed, instead of waiting for ever."""
    from datetime import timedelta

    from django.utils import timezone

    from marketplace.rounds.maintenance import close_overdue_rounds

    silos = [make_agent(local_datasets=CLINIC) for _ in range(4)]
    job = submit_federated(buyer, spec=SPEC)
    tasks = [a.claim() for a in silos]
    nodes = [Participant() for _ in silos]
    for a, t, p in zip(silos, tasks, nodes, strict=True):
        body = {"c_key": p.c.public.hex(), "s_key": p.s.public.hex()}
        a.client.post(_url(t), body, format="json")
    view = silos[0].client.get(_url(tasks[0])).json()
    roster = Roster(
        bytes.fromhex(view["context"]), view["threshold"],
        {m["index"]: bytes.fromhex(m["c_key"]) for m in view["members"]},
        {m["index"]: bytes.fromhex(m["s_key"]) for m in view["members"]},
    )  # fmt: skip
    for a, t, p in zip(silos, tasks, nodes, strict=True):
        sealed = p.shares(roster, a.client.get(_url(t)).json()["index"])
        a.client.post(_url(t, "/shares"), {"shares": {str(k): v.hex() for k, v in
                      sealed.items()}}, format="json")  # fmt: skip
    for a, t, p in zip(silos, tasks, nodes, strict=True):
        got = a.client.get(_url(t, "/shares")).json()["shares"]
        p.receive({int(k): bytes.fromhex(v) for k, v in got.items()})
    size = sum(v.numel() for v in decode_state(silos[0].model(tasks[0]["id"]).content)[0].values())
    for a, t, p in list(zip(silos, tasks, nodes, strict=True))[:3]:
        masked = p.mask(gf.quantize(np.zeros(size), 4, 8.0))
        a.upload(t["id"], encode_masked(masked, {}), {"loss": 1.0, "samples": 100})
    for a, t, p in list(zip(silos, tasks, nodes, strict=True))[:2]:  # the third stays silent
        replies = p.unmask([1, 2, 3], [4])
        body = {"shares": {str(u): [k, to_bytes(y).hex()] for u, (k, y) in replies.items()}}
        assert a.client.post(_url(t, "/unmask"), body, format="json").status_code == 200
    assert close_overdue_rounds() == 0  # not overdue: nothing happens
    past = timezone.now() - timedelta(seconds=1)
    Round.objects.filter(job_id=job["id"]).update(deadline=past)
    close_overdue_rounds()
    assert Job.objects.get(pk=job["id"]).status == "running"  # setup_s has not passed yet
    SecAggRound.objects.filter(round__job_id=job["id"]).update(phase_deadline=past)
    close_overdue_rounds()
    failed = Job.objects.get(pk=job["id"])
    assert failed.status == "failed" and "2 of the round's survivors" in failed.error


def test_a_round_with_too_few_nodes_for_secure_aggregation_ends_the_job(make_agent, buyer) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from marketplace.rounds.maintenance import close_overdue_rounds

    silos = [make_agent(local_datasets=CLINIC) for _ in range(2)]
    job = submit_federated(buyer, spec=SPEC)
    for a in silos:
        t, p = a.claim(), Participant()
        body = {"c_key": p.c.public.hex(), "s_key": p.s.public.hex()}
        view = a.client.post(_url(t), body, format="json").json()
        assert view["phase"] == "advertise"  # two nodes are not enough: no roster
    past = timezone.now() - timedelta(seconds=1)
    Round.objects.filter(job_id=job["id"]).update(deadline=past)
    SecAggRound.objects.filter(round__job_id=job["id"]).update(phase_deadline=past)
    close_overdue_rounds()
    failed = Job.objects.get(pk=job["id"])
    assert failed.status == "failed" and "at least 3 nodes" in failed.error
