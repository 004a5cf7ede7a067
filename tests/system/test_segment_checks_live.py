"""Proof-of-learning segment checks on the real path (issue 35): real `gpuflex-node` agent
processes, the web server and the Celery worker. Every upload is checked
(GPUFLEX_SEGMENT_CHECK_SHARE=1): the honest agent's checks pass, and the agent started by
`python -m desktop.fault_injection --byzantine half_steps` (it trains half the steps and
states the task's boundaries) fails every one it is asked for."""

from __future__ import annotations

import json

import pytest

from marketplace.demo.cluster import NodePlan
from tests.system.harness import PRICE, SPEC, System, manage, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]

HONEST = NodePlan("honest", kind="platform", price=PRICE)
LAZY = NodePlan("lazy", kind="platform", price=PRICE, byzantine="half_steps")
FP16 = NodePlan("fp16", kind="platform", price=PRICE, byzantine="precision_claim")
_CHECKS = (
    "import json; from marketplace.proofs.models import SegmentCheck as C; "
    "print(json.dumps([[c.node.name, c.status, c.distance, c.rerun_steps, c.task_steps, "
    "c.reason, c.result.task.round.number] for c in "
    "C.objects.select_related('node', 'result__task__round').order_by('pk')]))"
)


def _checks(s: System) -> list[list]:
    return json.loads(manage(s.cluster, "shell", "-c", _CHECKS).strip().splitlines()[-1])


def test_segment_checks_pass_an_honest_agent_and_catch_half_the_steps(system) -> None:
    """And an agent that trains in fp16 and claims fp32 (`precision_claim`): its checkpoints
    hold the fp16 loss scaler they commit to."""
    s = system(nodes=(HONEST, LAZY, FP16), GPUFLEX_SEGMENT_CHECK_SHARE="1")
    s.start()
    s.wait_idle()
    spec = SPEC | {"name": "segment-checks", "local": {"steps": 16, "batch_size": 32},
                   "rounds": {"max_rounds": 2, "deadline_s": 60},
                   "sharding": {"method": "stratified", "num_shards": 3}}  # fmt: skip
    s.wait_done(s.submit(spec), timeout=240)

    def settled() -> list[list] | None:
        checks = _checks(s)
        by = {name for name, *_ in checks}
        done = all(status in ("passed", "failed") for _, status, *_ in checks)
        return checks if done and by == {"honest", "lazy", "fp16"} else None

    checks = wait_for(settled, 120, "every agent's segment checks to settle", every=2.0)
    print("segment checks:", checks)  # distances and costs, for `pytest -s`
    for name, status, distance, rerun, steps, reason, _ in checks:
        if name == "honest":
            assert status == "passed" and distance == 0.0, reason
            assert rerun * 4 == steps == 16  # a quarter of the task re-run
        elif name == "fp16":
            assert status == "failed" and "fp16 loss scaling" in reason, reason
        else:
            assert status == "failed" and distance > 0.25, reason


CHEATS = (
    NodePlan("scaled", kind="platform", price=PRICE, byzantine="scaled"),
    NodePlan("wrongshard", kind="platform", price=PRICE, byzantine="wrong_shard"),
    NodePlan("stale", kind="platform", price=PRICE, byzantine="stale"),
)


def test_segment_checks_catch_scaled_wrong_shard_and_stale_agents(system) -> None:
    """The honest agent beside three cheats. `stale` sends its own earlier round's update
    (another's when it has none of its shard) and trains nothing, so its round-1 tasks, with
    nothing to send again, are honest work; every later one is caught."""
    s = system(nodes=(HONEST, *CHEATS), GPUFLEX_SEGMENT_CHECK_SHARE="1")
    s.start()
    s.wait_idle()
    spec = SPEC | {"name": "segment-cheats", "local": {"steps": 16, "batch_size": 32},
                   "rounds": {"max_rounds": 4, "deadline_s": 60},
                   "sharding": {"method": "stratified", "num_shards": 4}}  # fmt: skip
    s.wait_done(s.submit(spec), timeout=400)
    names = {"honest", *(n.name for n in CHEATS)}

    def settled() -> list[list] | None:
        checks = _checks(s)
        done = all(status in ("passed", "failed") for _, status, *_ in checks)
        return checks if done and {name for name, *_ in checks} == names else None

    checks = wait_for(settled, 180, "every agent's segment checks to settle", every=2.0)
    print("segment checks:", checks)
    by: dict[str, list[str]] = {}
    stale: dict[bool, set[str]] = {}
    for name, status, _, _, _, reason, round_ in checks:
        by.setdefault(name, []).append(status)
        if name == "scaled":
            assert "uploaded update" in reason, reason
        if name == "stale":  # in round 1 it had nothing to send again: honest work
            stale.setdefault(round_ > 1, set()).add(status)
    assert set(by["honest"]) == {"passed"}
    assert set(by["scaled"]) == set(by["wrongshard"]) == {"failed"}
    assert stale.get(True) == {"failed"} and stale.get(False, {"passed"}) == {"passed"}, checks
