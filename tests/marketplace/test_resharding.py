"""Elastic jobs re-cut their training split at round boundaries into one shard per online
node, as a new generation; capability jobs weigh the new shards by node throughput."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch

from marketplace.jobs import files
from marketplace.jobs.datasets import job_dataset
from marketplace.jobs.models import Job, Shard
from marketplace.nodes.models import Node, NodeState
from marketplace.rounds.aggregation import artifact_store
from marketplace.rounds.lifecycle import fewest_shards, quorum_units
from marketplace.rounds.models import Round, Task
from marketplace.rounds.resharding import shard_count
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from trainer.aggregation import round_size_problems
from trainer.hashing import state_hash
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.spec import parse_spec
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)


def spec_with(sharding: dict[str, Any], **sections: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["sharding"] = sharding
    return spec | sections


def elastic(num_shards: int, **sections: Any) -> dict[str, Any]:
    sharding = {"method": "stratified", "num_shards": num_shards, "elastic": True}
    return spec_with(sharding, **sections)


def round_shards(job_id: str, number: int) -> list[Shard]:
    """The shards a round's primary tasks train on, in index order."""
    tasks = Task.objects.filter(round__job_id=job_id, round__number=number, replica=0)
    return sorted((t.shard for t in tasks.select_related("shard")), key=lambda s: s.index)


def rows_of(shards: list[Shard]) -> Counter[bytes]:
    """Every training row the shards' stored files hold (x and y bytes), with multiplicity;
    each file must also match its row's hash and size."""
    rows: Counter[bytes] = Counter()
    for shard in shards:
        tensors, _ = decode_state(files.get(shard.file))
        x, y = tensors["x"], tensors["y"]
        assert state_hash({"x": x, "y": y}) == shard.content_hash and len(y) == shard.size
        rows.update(row_keys(x, y))
    return rows


def row_keys(x: torch.Tensor, y: torch.Tensor) -> list[bytes]:
    return [xi.numpy().tobytes() + yi.numpy().tobytes() for xi, yi in zip(x, y, strict=True)]


def split_rows(job_id: str) -> Counter[bytes]:
    data = job_dataset(Job.objects.get(pk=job_id))
    return Counter(row_keys(data.x_train, data.y_train))


def work_round(agents, job_id: str, number: int) -> None:
    """The agents work round `number`'s tasks until it has closed."""
    for _ in range(50):
        for agent in agents:
            if Round.objects.get(job_id=job_id, number=number).status != "open":
                return
            task = agent.claim()
            if task is not None:
                assert task["round"] == number
                assert agent.work(task).status_code == 202
    raise AssertionError(f"round {number} never closed")


def test_joining_nodes_get_a_new_generation_covering_the_split_once(
    make_agent, submit, buyer
) -> None:
    first = [make_agent(kind="platform") for _ in range(3)]
    job = submit(elastic(3), tier="platform")
    tasks = [agent.claim() for agent in first]
    before = {s.pk: (s.file, s.content_hash) for s in Shard.objects.filter(job_id=job["id"])}
    joined = [make_agent(kind="platform") for _ in range(2)]  # online from registration
    for agent, task in zip(first, tasks, strict=True):
        assert agent.work(task).status_code == 202  # the last upload opens round 2

    old, new = round_shards(job["id"], 1), round_shards(job["id"], 2)
    assert [s.generation for s in old] == [0, 0, 0] and {s.pk for s in old} == set(before)
    assert [s.generation for s in new] == [1] * 5 and [s.index for s in new] == list(range(5))
    split = split_rows(job["id"])
    assert rows_of(new) == split and sum(s.size for s in new) == sum(split.values())
    # round 1's shards are kept as they were, for its provenance and verification
    assert rows_of(old) == split
    assert {s.pk: (s.file, s.content_hash) for s in old} == before

    assert run_until_idle(first + joined) == 5
    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed" and detail["rounds_done"] == 2
    rounds = buyer.get(f"/api/v1/jobs/{job['id']}/rounds/").json()["results"]
    assert [r["metrics"]["participants"] for r in rounds] == [3, 5]
    chain = ProvenanceChain.from_json(
        buyer.get(f"/api/v1/jobs/{job['id']}/provenance").content.decode()
    )
    report = verify_with_artifacts(chain, artifact_store(), parse_spec(detail["spec"]).aggregation)
    assert report.ok, str(report)


def test_a_node_leaving_shrinks_the_next_cut(make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(elastic(3), tier="platform")
    tasks = [agent.claim() for agent in agents]
    assert agents[2].work(tasks[2]).status_code == 202
    Node.objects.filter(pk=agents[2].node_id).update(state=NodeState.OFFLINE)  # it left
    for agent, task in zip(agents[:2], tasks[:2], strict=True):
        assert agent.work(task).status_code == 202

    new = round_shards(job["id"], 2)
    assert [(s.generation, s.index) for s in new] == [(1, 0), (1, 1)]
    assert rows_of(new) == split_rows(job["id"])


def test_no_cut_goes_below_what_krum_needs(make_agent, submit) -> None:
    """Krum with byzantine 0 needs 3 updates a round: two nodes still get three shards."""
    agents = [make_agent(kind="platform") for _ in range(2)]
    krum = {"strategy": "krum", "byzantine": 0}
    job = submit(elastic(4, aggregation=krum), tier="platform")
    work_round(agents, job["id"], 1)
    new = round_shards(job["id"], 2)
    assert [(s.generation, s.index) for s in new] == [(1, 0), (1, 1), (1, 2)]
    assert rows_of(new) == split_rows(job["id"])
    run_until_idle(agents)
    assert Job.objects.get(pk=job["id"]).status == "completed"


@pytest.mark.parametrize(
    ("aggregation", "quorum"),
    [
        ({"strategy": "fedavg"}, 1.0),
        ({"strategy": "krum", "byzantine": 0}, 1.0),
        ({"strategy": "krum", "byzantine": 1}, 0.8),
        ({"strategy": "krum", "byzantine": 2, "krum_select": 9}, 0.5),
    ],
)
def test_fewest_shards_is_the_submission_rule(aggregation: dict, quorum: float) -> None:
    """The smallest count whose quorum submission's round-size check accepts."""
    spec = parse_spec(SMALL_SPEC | {"aggregation": aggregation, "rounds": {"quorum": quorum}})
    fewest = fewest_shards(spec)

    def accepted(n: int) -> bool:
        return not round_size_problems(spec.aggregation, quorum_units(quorum, n))

    assert accepted(fewest) and (fewest == 1 or not accepted(fewest - 1))


def test_shard_count_is_one_per_node_within_bounds() -> None:
    assert shard_count(5, 1, 1000) == 5
    assert shard_count(2, 3, 1000) == 3  # the strategy's minimum
    assert shard_count(10_000, 1, 100_000) == 256  # MAX_SHARDS
    assert shard_count(50, 1, 20) == 20  # a shard needs a sample


def test_capability_cut_gives_the_faster_node_a_proportionally_larger_shard(
    make_agent, submit
) -> None:
    # a node's speed is its one figure (nodes.selectors.speed_of): its fp32 benchmark here
    fast = make_agent(
        kind="platform", benchmark={"fp32_tflops": 30.0, "train_samples_per_s": {"mlp": 3000}}
    )
    slow = make_agent(
        kind="platform", benchmark={"fp32_tflops": 10.0, "train_samples_per_s": {"mlp": 1000}}
    )
    spec = spec_with(
        {"method": "capability", "num_shards": 2},
        local={"epochs": 1, "batch_size": 32},
        rounds={"max_rounds": 3},
    )
    job = submit(spec, tier="platform")
    first = round_shards(job["id"], 1)
    assert abs(first[0].size - first[1].size) <= 1  # nobody known at submission: equal
    work_round([fast, slow], job["id"], 1)

    big, small = round_shards(job["id"], 2)  # same count, other sizes: a new generation
    assert big.generation == small.generation == 1
    total = big.size + small.size
    assert total == sum(s.size for s in first)
    assert abs(big.size - 3 * total / 4) <= 1  # 3x the throughput, 3x the share
    assert rows_of([big, small]) == split_rows(job["id"])
    # largest first, in claim order: the node that claims first (here the fast one) gets it
    task = fast.claim()
    assert task["shard_hash"] == big.content_hash
    other = slow.claim()
    assert other["shard_hash"] == small.content_hash
    assert task["steps"] > 2 * other["steps"]  # an epoch of a 3x shard: 3x the steps
    assert fast.work(task).status_code == 202 and slow.work(other).status_code == 202

    # the same cohort asks for the same cut: round 3 keeps generation 1
    assert [s.pk for s in round_shards(job["id"], 3)] == [big.pk, small.pk]
    run_until_idle([fast, slow])
    assert Job.objects.get(pk=job["id"]).status == "completed"


def test_a_job_that_is_not_elastic_keeps_its_shards(make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(2)]
    job = submit(spec_with({"method": "stratified", "num_shards": 3}), tier="platform")
    work_round(agents, job["id"], 1)
    assert [s.pk for s in round_shards(job["id"], 2)] == [s.pk for s in round_shards(job["id"], 1)]
    assert set(Shard.objects.filter(job_id=job["id"]).values_list("generation", flat=True)) == {0}
    run_until_idle(agents)
    assert Job.objects.get(pk=job["id"]).status == "completed"


def test_an_elastic_job_keeps_its_cut_while_the_cohort_fits_it(make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(elastic(3), tier="platform")
    work_round(agents, job["id"], 1)
    assert [s.pk for s in round_shards(job["id"], 2)] == [s.pk for s in round_shards(job["id"], 1)]


def test_a_federated_job_cannot_be_elastic(buyer) -> None:
    spec = spec_with({"method": "prepartitioned", "elastic": True}, local={"steps": 5})
    body = {"spec": spec, "max_price_per_gpu_hour": "1", "budget": "10"}
    response = buyer.post("/api/v1/jobs/", body | {"federated_dataset": "clinic"}, format="json")
    assert response.status_code == 400
    assert [p["field"] for p in response.json()["problems"]] == ["sharding.elastic"]
