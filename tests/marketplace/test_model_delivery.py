"""Model delivery through the agent API: round 1 built from the seed, later rounds as delta
chains against the version the server knows a node holds, and shard affinity in claims."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from marketplace.jobs.models import Job
from marketplace.nodes.models import NodeTraffic
from marketplace.rounds.models import ModelCopy, Round
from tests.marketplace.helpers import SMALL_SPEC
from trainer.delivery import apply_delta
from trainer.hashing import state_hash
from trainer.models import build_model
from trainer.spec import parse_spec

pytestmark = pytest.mark.django_db(transaction=True)

DELTA_SPEC: dict[str, Any] = copy.deepcopy(SMALL_SPEC) | {
    "compression": {"download_codec": "int8"},
    "rounds": {"max_rounds": 4},
}


def _work_round(agent, n: int) -> list[dict[str, Any]]:
    """Claim and do `n` tasks (the agent downloads each task's model whole)."""
    tasks = []
    for _ in range(n):
        task = agent.claim()
        assert task is not None
        assert agent.work(task).status_code == 202
        tasks.append(task)
    return tasks


def _rebuild(agent, task: dict[str, Any], base: dict) -> dict:
    """What the real agent and runner do with a delta source: follow the chain."""
    source = task["model_source"]
    held, state = source["base"], base
    for step in source["chain"]:
        response = agent.client.get(f"/api/v1/agent/tasks/{task['id']}/model", {"base": held})
        assert response.status_code == 200, response.content
        assert response["X-GPUFlex-Model-Hash"] == step
        state = apply_delta(state, response.content)
        held = step
    return state


def test_round_one_is_built_from_the_seed(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    submit(spec=DELTA_SPEC, tier="platform")
    task = agent.claim()
    source = task["model_source"]
    assert source == {"kind": "seed", "input_shape": [64], "num_classes": 10}
    spec = parse_spec(task["spec"])
    model = build_model(spec.model, tuple(source["input_shape"]), 10, seed=spec.seed)
    assert state_hash(model.state_dict()) == task["model_hash"]  # what the runner checks


def test_a_node_handed_the_seed_model_gets_the_next_round_as_a_delta(make_agent, submit) -> None:
    """Round 1's model is built on the node, never downloaded: the server counts it held
    from the hand-out, so a node whose round-1 update never counted (cancelled, late,
    failed) still gets round 2 as a delta, not whole."""
    a, b = make_agent(kind="platform"), make_agent(kind="platform")
    job = submit(spec=DELTA_SPEC, tier="platform")
    seeded = b.claim()
    assert seeded["model_source"]["kind"] == "seed"
    fail = b.client.post(f"/api/v1/agent/tasks/{seeded['id']}/fail",
                         {"reason": "crashed", "detail": "test"}, format="json")  # fmt: skip
    assert fail.status_code == 200
    _work_round(a, 3)  # round 1 closes without b's update
    r1, r2 = (Round.objects.get(job=job["id"], number=n) for n in (1, 2))
    task = b.claim()
    assert task["round"] == 2
    assert task["model_source"] == {"kind": "delta", "base": r1.input_model_hash,
                                    "chain": [r2.input_model_hash]}  # fmt: skip


def test_later_rounds_come_as_deltas_against_the_nodes_copy(make_agent, submit) -> None:
    a, b = make_agent(kind="platform"), make_agent(kind="platform")
    job = submit(spec=DELTA_SPEC, tier="platform")
    _work_round(a, 2)
    _work_round(b, 1)  # round 1 closes; both trained on its model
    r1, r2 = (Round.objects.get(job=job["id"], number=n) for n in (1, 2))
    assert r2.input_delta_base == r1.input_model_hash and r2.input_delta_size > 0
    assert ModelCopy.objects.get(node=b.node_id, job=job["id"]).round_number == 1

    task = b.claim()
    assert task["round"] == 2
    assert task["model_source"] == {"kind": "delta", "base": r1.input_model_hash,
                                    "chain": [r2.input_model_hash]}  # fmt: skip
    before = NodeTraffic.objects.get(node=b.node_id).bytes_down
    rebuilt = _rebuild(b, task, _round_state(r1))
    assert state_hash(rebuilt) == task["model_hash"]  # bit for bit: what the runner checks
    delta_bytes = NodeTraffic.objects.get(node=b.node_id).bytes_down - before
    assert ModelCopy.objects.get(node=b.node_id, job=job["id"]).round_number == 2
    whole = len(b.model(task["id"]).content)
    assert delta_bytes < whole / 2  # int8 steps: about a quarter of fp32, and a header


def _round_state(rnd: Round) -> dict:
    from marketplace.jobs.models_io import load_model_file

    return load_model_file(rnd.input_model_file)


def test_a_node_two_rounds_behind_follows_a_chain(make_agent, submit) -> None:
    a, b = make_agent(kind="platform"), make_agent(kind="platform")
    job = submit(spec=DELTA_SPEC, tier="platform")
    _work_round(b, 1)
    _work_round(a, 2)  # round 1 done: b holds round 1
    _work_round(a, 3)  # round 2 done by a alone
    task = b.claim()
    assert task["round"] == 3
    r1, r2, r3 = (Round.objects.get(job=job["id"], number=n) for n in (1, 2, 3))
    chain = [r2.input_model_hash, r3.input_model_hash]
    assert task["model_source"] == {"kind": "delta", "base": r1.input_model_hash, "chain": chain}
    assert state_hash(_rebuild(b, task, _round_state(r1))) == r3.input_model_hash
    # the download of the last step tells the server b holds round 3 now
    assert ModelCopy.objects.get(node=b.node_id, job=job["id"]).round_number == 3


def test_a_base_the_server_has_no_chain_from_is_refused(make_agent, submit) -> None:
    a = make_agent(kind="platform")
    submit(spec=DELTA_SPEC, tier="platform")
    task = a.claim()
    response = a.client.get(f"/api/v1/agent/tasks/{task['id']}/model", {"base": "ab" * 32})
    assert response.status_code == 400
    assert "No delta leads from model abababababab" in response.json()["detail"]


def test_plain_jobs_download_whole_models(make_agent, submit) -> None:
    a = make_agent(kind="platform")
    spec = copy.deepcopy(SMALL_SPEC) | {"rounds": {"max_rounds": 3}}
    job = submit(spec=spec, tier="platform")
    assert all(t["model_source"] == {"kind": "full"} for t in _work_round(a, 3))
    task = a.claim()
    assert task["round"] == 2 and task["model_source"] == {"kind": "full"}
    assert not Round.objects.get(job=job["id"], number=2).input_delta_file


def test_claims_prefer_the_shards_a_node_holds(make_agent, submit) -> None:
    a = make_agent(kind="platform")
    job = submit(spec=DELTA_SPEC, tier="platform")
    tasks = [a.claim() for _ in range(3)]
    last = tasks[-1]
    assert a.shard(last["id"]).status_code == 200  # a downloads only the third shard
    for task in tasks:
        assert a.work(task).status_code == 202  # (work() fetches every shard: see below)
    # every shard is held now; drop all but the third to see the preference
    from marketplace.rounds.models import ShardCopy

    ShardCopy.objects.exclude(shard__content_hash=last["shard_hash"]).delete()
    assert Job.objects.get(pk=job["id"]).rounds_done == 1
    first = a.claim()
    assert first["round"] == 2 and first["shard_hash"] == last["shard_hash"]
