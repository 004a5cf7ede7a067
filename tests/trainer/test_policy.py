"""The adaptation policy's decisions on hand-built measurement sets."""

import pytest

from trainer.adapt import NodeMeasurement, PolicyState, Tier, health, plan_round, tier
from trainer.spec import parse_spec

NUMEL = 9610  # the digits MLP


def _spec(**sections):
    return parse_spec({"name": "p", "adaptation": {"enabled": True}, **sections})


def _node(nid: str, **kw) -> NodeMeasurement:
    base = {"step_s": 0.002, "rtt_s": 0.1, "up_bps": 100e6, "down_bps": 100e6, "loss": 0.0}
    return NodeMeasurement(node_id=nid, **{**base, **kw})


def test_equal_nodes_get_equal_work_and_all_participate() -> None:
    plan, _ = plan_round(_spec(), NUMEL, [_node(f"n{i}") for i in range(4)])
    steps = {p.steps for p in plan.nodes.values()}
    assert len(steps) == 1 and all(p.participate for p in plan.nodes.values())
    assert plan.quorum == 4 and plan.deadline_s > plan.round_s


def test_slower_nodes_get_fewer_steps_so_everyone_finishes_together() -> None:
    nodes = [_node("fast", step_s=0.001), _node("mid", step_s=0.002), _node("slow", step_s=0.004)]
    plan, _ = plan_round(_spec(compression={"codec": "none"}), NUMEL, nodes)
    fast, mid, slow = (plan.nodes[n] for n in ("fast", "mid", "slow"))
    assert fast.steps == pytest.approx(4 * slow.steps, rel=0.02)
    assert mid.steps == pytest.approx(2 * slow.steps, rel=0.02)
    finish = [p.expected_s for p in (fast, mid, slow)]
    assert max(finish) - min(finish) < 0.01 * max(finish)


def test_codec_follows_the_link() -> None:
    nodes = [
        _node("lan", rtt_s=0.001, up_bps=10e9, down_bps=10e9),
        _node("lossy", rtt_s=0.3, up_bps=20e6, down_bps=20e6, loss=0.05),
        _node("dsl", rtt_s=0.05, up_bps=2e6, down_bps=20e6),
    ]
    plan, _ = plan_round(_spec(compression={"codec": "auto"}), NUMEL, nodes)
    assert plan.nodes["lan"].codec == "none"
    assert plan.nodes["lossy"].codec == "topk"
    assert plan.nodes["dsl"].codec in ("int8", "int4", "topk")
    assert plan.nodes["lossy"].download_codec == "int8"


def test_a_codec_fixed_in_the_spec_is_used_everywhere() -> None:
    nodes = [_node("a", rtt_s=0.001, up_bps=10e9), _node("b", loss=0.05, rtt_s=0.3)]
    plan, _ = plan_round(_spec(compression={"codec": "int4"}), NUMEL, nodes)
    assert {p.codec for p in plan.nodes.values()} == {"int4"}


def test_far_nodes_sync_every_other_round_without_holding_the_round_back() -> None:
    nodes = [_node(f"n{i}") for i in range(4)] + [_node("far", rtt_s=2.0, loss=0.05)]
    plan, _ = plan_round(_spec(), NUMEL, nodes)
    far = plan.nodes["far"]
    assert far.sync_every == 2 and far.participate
    assert all(plan.nodes[f"n{i}"].sync_every == 1 for i in range(4))
    assert plan.round_s < far.expected_s


def test_steps_respect_the_spec_bounds() -> None:
    spec = _spec(adaptation={"enabled": True, "min_local_steps": 5, "max_local_steps": 50})
    plan, _ = plan_round(spec, NUMEL, [_node("a", step_s=1e-6), _node("b", step_s=10.0)])
    assert plan.nodes["a"].steps == 50 and plan.nodes["b"].steps == 5


def test_health_uses_the_documented_weights() -> None:
    h = health(_node("x", rtt_s=0.0), reference_step_s=0.002)
    assert h.score == pytest.approx(1.0)
    slow = health(_node("x", rtt_s=0.0, step_s=0.004), reference_step_s=0.002)
    assert slow.compute == pytest.approx(0.5)
    assert slow.score == pytest.approx(1.0 - 0.4 * 0.5)


def test_bad_nodes_are_excluded_and_readmitted_only_after_recovering() -> None:
    bad = _node(
        "bad",
        agreement=-1.0,
        updates=4,
        validation_failures=4,
        transfers=4,
        failed_transfers=4,
        uptime=0.0,
        step_s=0.02,
    )
    plan, state = plan_round(_spec(), NUMEL, [_node("ok"), _node("ok2"), bad])
    assert plan.nodes["bad"].tier is Tier.EXCLUDED and not plan.nodes["bad"].participate
    assert state.tiers["bad"] is Tier.EXCLUDED
    # hysteresis: just above the exclusion line is not enough to come back
    assert tier(0.35, Tier.EXCLUDED) is Tier.EXCLUDED
    assert tier(0.35, None) is Tier.REDUCED
    assert tier(0.45, Tier.EXCLUDED) is Tier.REDUCED


def test_reduced_nodes_do_half_the_work() -> None:
    meh = _node("meh", agreement=-0.2, transfers=10, failed_transfers=3, uptime=0.5, step_s=0.008)
    assert tier(health(meh, 0.002).score) is Tier.REDUCED
    oks = [_node(f"ok{i}") for i in range(3)]
    plan, _ = plan_round(_spec(compression={"codec": "none"}), NUMEL, [*oks, meh])
    assert plan.nodes["meh"].tier is Tier.REDUCED
    # a quarter of the steps for a 4x slower node, then half of that for its tier
    assert plan.nodes["meh"].steps == pytest.approx(plan.nodes["ok0"].steps / 8, abs=1)


def test_a_job_never_stalls_when_every_node_looks_bad() -> None:
    bad = {"agreement": -1.0, "updates": 2, "validation_failures": 2, "uptime": 0.0}
    nodes = [_node("a", **bad), _node("b", **bad, step_s=0.004)]
    plan, _ = plan_round(_spec(), NUMEL, nodes, PolicyState())
    assert [p.node_id for p in plan.nodes.values() if p.participate] == ["a"]


def test_policy_needs_nodes() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        plan_round(_spec(), NUMEL, [])
