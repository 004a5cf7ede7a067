import pytest

from trainer.sim.network import (
    PROFILES,
    UnknownProfile,
    disconnects,
    get_profile,
    ring_allreduce_s,
)


def test_wan_nodes_are_drawn_within_the_documented_ranges_and_reproducibly() -> None:
    nodes = get_profile("wan").nodes(16, seed=3)
    assert nodes == get_profile("wan").nodes(16, seed=3)
    assert nodes != get_profile("wan").nodes(16, seed=4)
    for n in nodes:
        assert 0.05 <= n.rtt_s <= 0.3 and 0 <= n.loss <= 0.05
        assert 20e6 <= n.up_bps <= 200e6 and n.speed == 1.0


def test_transfer_time_charges_rtt_bandwidth_and_loss() -> None:
    lan = get_profile("lan").node(0, 1, 0)
    assert lan.transfer_s(1_250_000, upload=True) == pytest.approx(0.001 + 0.001)
    wan = get_profile("wan").node(0, 4, 0)
    lossless = wan.__class__(**{**wan.__dict__, "loss": 0.0})
    assert wan.transfer_s(10_000_000, True) >= lossless.transfer_s(10_000_000, True)


def test_hetero_spreads_speed_four_times() -> None:
    speeds = [n.speed for n in get_profile("hetero").nodes(8, 0)]
    assert max(speeds) / min(speeds) == pytest.approx(4.0)


def test_flaky_drops_about_a_fifth_of_node_rounds() -> None:
    nodes = get_profile("flaky").nodes(10, 0)
    drops = sum(disconnects(n, 0, r) is not None for n in nodes for r in range(200))
    assert 0.15 < drops / 2000 < 0.25
    assert all(disconnects(n, 0, 1) is None for n in get_profile("wan").nodes(10, 0))


def test_ring_allreduce_grows_with_node_count_and_is_free_alone() -> None:
    wan = get_profile("wan")
    assert ring_allreduce_s(wan.nodes(1, 0), 40_000) == 0
    assert ring_allreduce_s(wan.nodes(8, 0), 40_000) > ring_allreduce_s(wan.nodes(2, 0), 40_000)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(UnknownProfile, match="lan, wan, flaky, hetero"):
        get_profile("moon")
    assert set(PROFILES) == {"lan", "wan", "flaky", "hetero"}


def test_flaky_and_hetero_draw_the_same_links_as_wan() -> None:
    wan = get_profile("wan").nodes(8, 5)
    for name in ("flaky", "hetero"):
        other = get_profile(name).nodes(8, 5)
        assert [(n.rtt_s, n.loss, n.up_bps) for n in other] == [
            (n.rtt_s, n.loss, n.up_bps) for n in wan
        ]
