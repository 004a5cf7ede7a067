"""Aggregation rules and server strategies, checked against hand-computed examples."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator

import pytest
import torch

from trainer.aggregation import (
    ClientUpdate,
    DiLoCo,
    FedAdam,
    FedAvg,
    FedProx,
    Median,
    MultiKrum,
    Strategy,
    TrimmedMean,
    build_strategy,
    coordinate_median,
    flatten_state,
    krum_scores,
    multi_krum,
    trimmed_mean,
    unflatten_state,
    weighted_mean,
)
from trainer.aggregation.functions import pairwise_sq_distances, trim_count
from trainer.spec import AggregationSpec
from trainer.updates import decode_state, encode_state

F64 = torch.float64


def s(*values: float) -> dict[str, torch.Tensor]:
    """A one-tensor state dict holding a float64 vector."""
    return {"w": torch.tensor(values, dtype=F64)}


def close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert actual[name].dtype == expected[name].dtype, name
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-12)


def cu(node: str, state: dict[str, torch.Tensor], n: int = 1) -> ClientUpdate:
    return ClientUpdate(node_id=node, delta=state, num_samples=n)


# ------------------------------------------------------------------ weighted mean

# u1 = [1, 2, 3] (w=1), u2 = [4, 5, 6] (w=2), u3 = [-3, 0, 3] (w=1)
# sum w*u = [1 + 8 - 3, 2 + 10 + 0, 3 + 12 + 3] = [6, 12, 18]; sum w = 4
# weighted mean = [1.5, 3, 4.5]
WM = [(s(1, 2, 3), 1.0), (s(4, 5, 6), 2.0), (s(-3, 0, 3), 1.0)]


def test_weighted_mean_hand_example() -> None:
    close(weighted_mean(WM), s(1.5, 3, 4.5))


def test_weighted_mean_accepts_a_generator_and_keeps_dtype() -> None:
    gen = ((state, w) for state, w in WM)
    close(weighted_mean(gen), s(1.5, 3, 4.5))
    f32 = [({"w": st["w"].float()}, w) for st, w in WM]
    out = weighted_mean(iter(f32))
    assert out["w"].dtype == torch.float32
    assert weighted_mean(iter(f32), dtype=F64)["w"].dtype == F64


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf])
def test_weighted_mean_rejects_bad_weights(bad: float) -> None:
    with pytest.raises(ValueError, match="update 1"):
        weighted_mean([(s(1, 2, 3), 1.0), (s(1, 2, 3), bad)])


def test_weighted_mean_rejects_empty_and_mismatched() -> None:
    with pytest.raises(ValueError, match="no updates"):
        weighted_mean(iter([]))
    with pytest.raises(ValueError, match="shape"):
        weighted_mean([(s(1, 2, 3), 1.0), (s(1, 2), 1.0)])
    with pytest.raises(ValueError, match="keys differ"):
        weighted_mean([(s(1, 2, 3), 1.0), ({"v": torch.zeros(3, dtype=F64)}, 1.0)])
    with pytest.raises(TypeError, match="non-floating"):
        weighted_mean([({"w": torch.tensor([1, 2])}, 1.0)])


def test_weighted_mean_streams_with_at_most_two_updates_alive() -> None:
    alive = 0
    peak = 0

    def released() -> None:
        nonlocal alive
        alive -= 1

    def big(i: int) -> torch.Tensor:
        nonlocal alive, peak
        t = torch.full((1_000_000,), float(i))
        weakref.finalize(t, released)
        alive += 1
        peak = max(peak, alive)
        return t

    def updates() -> Iterator[tuple[dict[str, torch.Tensor], float]]:
        for i in range(200):
            yield {"w": big(i)}, 1.0

    out = weighted_mean(updates())
    # mean of 0..199 = 99.5 in every coordinate
    assert torch.equal(out["w"], torch.full((1_000_000,), 99.5))
    assert peak <= 2, f"{peak} updates were alive at once: weighted_mean does not stream"
    assert alive == 0


# -------------------------------------------------------------------- trimmed mean

# 5 updates, trim 0.2 -> k = floor(0.2 * 5) = 1 dropped at each end, per coordinate:
#   coord 0: 1, 2, 3, 4, 100      -> drop 1, 100      -> mean(2, 3, 4)     = 3
#   coord 1: -100, 10, 20, 30, 40 -> drop -100, 40    -> mean(10, 20, 30)  = 20
#   coord 2: -4, -3, -2, -1, 50   -> drop -4, 50      -> mean(-3, -2, -1)  = -2
TM = [s(1, 10, -1), s(2, 20, -2), s(3, 30, -3), s(4, 40, -4), s(100, -100, 50)]


def test_trimmed_mean_hand_example() -> None:
    close(trimmed_mean(TM, 0.2), s(3, 20, -2))


def test_trimmed_mean_without_trimming_is_the_mean() -> None:
    # trim 0.1 -> k = floor(0.5) = 0: plain mean = [110/5, 0/5, 40/5] = [22, 0, 8]
    close(trimmed_mean(TM, 0.1), s(22, 0, 8))


def test_trim_count_and_bounds() -> None:
    assert trim_count(5, 0.2) == 1
    assert trim_count(100, 0.29) == 29  # 0.29 * 100 is 28.999999999999996 in floats
    assert trim_count(8, 0.25) == 2
    with pytest.raises(ValueError, match="trim_fraction"):
        trimmed_mean(TM, 0.5)
    with pytest.raises(ValueError, match="no updates"):
        trimmed_mean([], 0.1)


# ------------------------------------------------------------------------- median

# odd n=3: coord 0: 1, 2, 10 -> 2; coord 1: 5, 6, 7 -> 6; coord 2: -3, -1, 0 -> -1
MED3 = [s(1, 5, -3), s(2, 7, 0), s(10, 6, -1)]
# even n=4 adds [3, 0, 4]: the true median is the mean of the two middles
#   coord 0: 1, 2 | 3, 10 -> 2.5;  coord 1: 0, 5 | 6, 7 -> 5.5;  coord 2: -3, -1 | 0, 4 -> -0.5
# (torch.median would give the lower middles [2, 5, -1])
MED4 = [*MED3, s(3, 0, 4)]


def test_median_odd_and_even() -> None:
    close(coordinate_median(MED3), s(2, 6, -1))
    close(coordinate_median(MED4), s(2.5, 5.5, -0.5))


# --------------------------------------------------------------------------- krum

# Five 2-D updates, f = 1, so each score sums the n - f - 2 = 2 smallest squared distances.
#   u0 = [0, 0], u1 = [1, 0], u2 = [0, 1], u3 = [2, 2], u4 = [10, 10]
# squared distances: d01=1 d02=1 d03=8 d04=200 d12=2 d13=5 d14=181 d23=5 d24=181 d34=128
#   s0 = 1 + 1 = 2;  s1 = 1 + 2 = 3;  s2 = 1 + 2 = 3;  s3 = 5 + 5 = 10;  s4 = 128 + 181 = 309
KR = [s(0, 0), s(1, 0), s(0, 1), s(2, 2), s(10, 10)]


def test_pairwise_distances_and_krum_scores() -> None:
    dist = pairwise_sq_distances(KR)
    assert dist[0, 4] == 200 and dist[3, 4] == 128 and dist[1, 2] == 2
    assert torch.equal(dist, dist.T)
    assert krum_scores(KR, 1) == [2.0, 3.0, 3.0, 10.0, 309.0]


def test_multi_krum_selection() -> None:
    # m = n - f = 4: u0..u3, mean = [(0+1+0+2)/4, (0+0+1+2)/4] = [0.75, 0.75]
    agg, chosen = multi_krum(KR, 1)
    assert chosen == [0, 1, 2, 3]
    close(agg, s(0.75, 0.75))
    # m = 1 is Krum: the single best, u0
    agg, chosen = multi_krum(KR, 1, 1)
    assert chosen == [0]
    close(agg, s(0, 0))
    # m = 2: scores tie at 3 between u1 and u2, the lower index wins -> u0, u1 -> [0.5, 0]
    agg, chosen = multi_krum(KR, 1, 2)
    assert chosen == [0, 1]
    close(agg, s(0.5, 0))


def test_krum_needs_enough_updates() -> None:
    with pytest.raises(ValueError, match=r"n > 2f \+ 2"):
        krum_scores(KR[:4], 1)  # 4 <= 2*1 + 2
    with pytest.raises(ValueError, match="between 1 and n"):
        multi_krum(KR, 1, 6)


# ------------------------------------------------------------------ flatten helpers


def test_flatten_unflatten_round_trip() -> None:
    state = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.tensor([7.0, 8.0], dtype=F64)}
    flat = flatten_state(state, dtype=F64)
    assert flat.tolist() == [7, 8, 0, 1, 2, 3, 4, 5]  # sorted keys: a then b
    back = unflatten_state(flat, state)
    for name in state:
        assert torch.equal(back[name], state[name]) and back[name].dtype == state[name].dtype


# ------------------------------------------------------- robustness to sign flips


def test_robust_rules_survive_scaled_sign_flips_and_the_mean_does_not() -> None:
    gen = torch.Generator().manual_seed(1)
    common = torch.randn(64, generator=gen, dtype=F64)
    honest_flat = [common + 0.1 * torch.randn(64, generator=gen, dtype=F64) for _ in range(6)]
    like = {"a": torch.zeros(8, 4, dtype=F64), "b": torch.zeros(32, dtype=F64)}
    honest = [unflatten_state(v, like) for v in honest_flat]
    attackers = [unflatten_state(-10 * honest_flat[i], like) for i in range(2)]
    updates = honest + attackers
    target = torch.stack(honest_flat).mean(0)

    def cos(state: dict[str, torch.Tensor]) -> float:
        return float(torch.nn.functional.cosine_similarity(flatten_state(state), target, dim=0))

    assert cos(weighted_mean((u, 1.0) for u in updates)) < 0
    assert cos(trimmed_mean(updates, 0.25)) > 0.9
    assert cos(coordinate_median(updates)) > 0.9
    agg, chosen = multi_krum(updates, 2)
    assert chosen == [0, 1, 2, 3, 4, 5]
    assert cos(agg) > 0.9


# ---------------------------------------------------------------------- strategies

# Shared round: global x = [1, 1, 1]; deltas a=[1,2,3] (n=1), b=[4,5,6] (n=2), c=[-3,0,3] (n=1)
# sample-weighted mean delta = [1.5, 3, 4.5] (as WM above)
X0 = s(1, 1, 1)


def fedavg_round() -> list[ClientUpdate]:
    return [cu("a", s(1, 2, 3), 1), cu("b", s(4, 5, 6), 2), cu("c", s(-3, 0, 3), 1)]


def test_fedavg_hand_example() -> None:
    # server_lr 0.5: [1 + 0.75, 1 + 1.5, 1 + 2.25] = [1.75, 2.5, 3.25]
    close(FedAvg(server_lr=0.5).aggregate(X0, fedavg_round()), s(1.75, 2.5, 3.25))
    # server_lr 1: [2.5, 4, 5.5], from a one-shot iterator
    close(FedAvg().aggregate(X0, iter(fedavg_round())), s(2.5, 4, 5.5))


def test_fedavg_keeps_the_global_dtype() -> None:
    x = {"w": torch.ones(3)}
    out = FedAvg().aggregate(x, [cu("a", {"w": torch.tensor([0.5, 1, 2])})])
    assert out["w"].dtype == torch.float32
    assert torch.equal(out["w"], torch.tensor([1.5, 2, 3]))


def test_fedavg_rejects_bad_sample_counts_and_mismatches() -> None:
    with pytest.raises(ValueError, match="node 'z'"):
        FedAvg().aggregate(X0, [cu("a", s(1, 2, 3)), cu("z", s(1, 2, 3), 0)])
    with pytest.raises(ValueError, match="no updates"):
        FedAvg().aggregate(X0, [])
    with pytest.raises(ValueError, match="'w'"):
        FedAvg().aggregate(X0, [cu("a", s(1, 2))])
    with pytest.raises(ValueError, match="unexpected"):  # a tensor the model does not have
        FedAvg().aggregate(X0, [cu("a", s(1, 2, 3) | {"v": torch.zeros(1, dtype=F64)})])
    # updates that carry part of the model (a LoRA job's adapters) step that part alone
    frozen = torch.ones(1, dtype=F64)
    new = FedAvg().aggregate({**X0, "v": frozen}, [cu("a", s(1, 2, 3))])
    assert torch.equal(new["v"], frozen) and new.keys() == {*X0, "v"}


def test_fedprox_aggregates_like_fedavg_and_exposes_mu() -> None:
    strategy = FedProx(mu=0.1, server_lr=0.5)
    assert strategy.proximal_mu == 0.1
    assert FedAvg().proximal_mu == 0.0
    close(strategy.aggregate(X0, fedavg_round()), s(1.75, 2.5, 3.25))


def test_trimmed_mean_strategy_ignores_sample_counts() -> None:
    # trimmed mean of TM (see above) = [3, 20, -2]; global 0 + 1 * that
    updates = [
        cu(str(i), st, n) for i, (st, n) in enumerate(zip(TM, [1, 1, 1, 1, 1000], strict=True))
    ]
    close(TrimmedMean(trim_fraction=0.2).aggregate(s(0, 0, 0), updates), s(3, 20, -2))


def test_median_strategy() -> None:
    # median of MED4 = [2.5, 5.5, -0.5]; [1, 1, 1] + 2 * that = [6, 12, 0]
    updates = [cu(str(i), st) for i, st in enumerate(MED4)]
    close(Median(server_lr=2.0).aggregate(X0, updates), s(6, 12, 0))


def test_multi_krum_strategy_records_the_selected_nodes() -> None:
    updates = [cu(f"n{i}", st) for i, st in enumerate(KR)]
    strategy = MultiKrum(byzantine=1)
    # selects u0..u3 (see KR): mean [0.75, 0.75]; global [1, 1] + that = [1.75, 1.75]
    close(strategy.aggregate(s(1, 1), updates), s(1.75, 1.75))
    assert strategy.last_selected == ["n0", "n1", "n2", "n3"]
    krum = MultiKrum(byzantine=1, select=1, server_lr=0.5)
    close(krum.aggregate(s(1, 1), updates), s(1, 1))  # u0 = [0, 0]
    assert krum.last_selected == ["n0"]
    with pytest.raises(ValueError, match=r"n > 2f \+ 2"):
        MultiKrum(byzantine=2).aggregate(s(1, 1), updates)


def test_fedadam_two_rounds_by_hand() -> None:
    lr, b1, b2, tau = 1.0, 0.5, 0.75, 0.5
    strategy = FedAdam(server_lr=lr, beta1=b1, beta2=b2, tau=tau)
    # round 1: Δ = weighted mean of [4,-4,0] (n=1) and [1,-4,0] (n=2) = [6/3, -12/3, 0]
    #   = [2, -4, 0]; m = 0.5 Δ = [1, -2, 0]; v = 0.25 Δ² = [1, 4, 0]; sqrt v = [1, 2, 0]
    #   x1 = 0 + m / (sqrt v + 0.5) = [1/1.5, -2/2.5, 0/0.5] = [2/3, -0.8, 0]
    x1 = strategy.aggregate(s(0, 0, 0), [cu("a", s(4, -4, 0), 1), cu("b", s(1, -4, 0), 2)])
    close(x1, s(2 / 3, -0.8, 0))
    # round 2: Δ = [2, 0, 4]; m = 0.5 [1,-2,0] + 0.5 [2,0,4] = [1.5, -1, 2]
    #   v = 0.75 [1,4,0] + 0.25 [4,0,16] = [1.75, 3, 4]
    #   x2 = x1 + [1.5 / (sqrt 1.75 + 0.5), -1 / (sqrt 3 + 0.5), 2 / (2 + 0.5)]
    x2 = strategy.aggregate(x1, [cu("a", s(2, 0, 4))])
    step = [1.5 / (math.sqrt(1.75) + 0.5), -1 / (math.sqrt(3) + 0.5), 0.8]
    close(x2, s(2 / 3 + step[0], -0.8 + step[1], step[2]))
    state = strategy.state_dict()
    assert int(state["step"]) == 2
    close({"w": state["m.w"]}, s(1.5, -1, 2))
    close({"w": state["v.w"]}, s(1.75, 3, 4))


def test_diloco_two_rounds_by_hand() -> None:
    strategy = DiLoCo(server_lr=0.5, momentum=0.9)
    # round 1: Δ = [1, -2, 0], g = -Δ = [-1, 2, 0]; buf = g (torch's first step)
    #   g + 0.9 buf = 1.9 g = [-1.9, 3.8, 0]; x1 = [1,1,1] - 0.5 * that = [1.95, -0.9, 1]
    x1 = strategy.aggregate(X0, [cu("a", s(1, -2, 0))])
    close(x1, s(1.95, -0.9, 1))
    close({"w": strategy.state_dict()["buf.w"]}, s(-1, 2, 0))
    # round 2: Δ = [0, 2, 1], g = [0, -2, -1]; buf = 0.9 [-1, 2, 0] + g = [-0.9, -0.2, -1]
    #   g + 0.9 buf = [-0.81, -2.18, -1.9]; x2 = x1 - 0.5 * that = [2.355, 0.19, 1.95]
    x2 = strategy.aggregate(x1, [cu("a", s(0, 2, 1))])
    close(x2, s(2.355, 0.19, 1.95))
    close({"w": strategy.state_dict()["buf.w"]}, s(-0.9, -0.2, -1))


def test_diloco_matches_torch_sgd_nesterov() -> None:
    gen = torch.Generator().manual_seed(3)
    x = {"a": torch.randn(4, 3, generator=gen), "b": torch.randn(5, generator=gen)}
    params = {k: torch.nn.Parameter(v.clone()) for k, v in x.items()}
    opt = torch.optim.SGD(params.values(), lr=0.7, momentum=0.9, nesterov=True, foreach=False)
    strategy = DiLoCo(server_lr=0.7, momentum=0.9)
    for _ in range(4):
        d = {k: torch.randn(v.shape, generator=gen) for k, v in x.items()}
        x = strategy.aggregate(x, [cu("a", d)])
        for k, p in params.items():
            p.grad = -d[k]  # the outer gradient
        opt.step()
    for k, p in params.items():
        torch.testing.assert_close(x[k], p.detach())


def random_rounds(seed: int, rounds: int) -> list[list[ClientUpdate]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for r in range(rounds):
        out.append(
            [
                cu(
                    f"n{i}",
                    {"a": torch.randn(3, 2, generator=gen), "b": torch.randn(4, generator=gen)},
                    n=i + r + 1,
                )
                for i in range(3)
            ]
        )
    return out


@pytest.mark.parametrize(
    "make",
    [lambda: FedAdam(0.1, 0.9, 0.99, 1e-3), lambda: DiLoCo(0.7, 0.9)],
    ids=["fedadam", "diloco"],
)
def test_resumed_state_gives_bit_identical_results(make) -> None:  # type: ignore[no-untyped-def]
    rounds = random_rounds(7, 3)
    x0 = {"a": torch.zeros(3, 2), "b": torch.ones(4)}

    straight = make()
    x = x0
    for updates in rounds:
        x = straight.aggregate(x, updates)

    first = make()
    x1 = first.aggregate(x0, rounds[0])
    checkpoint = encode_state(first.state_dict())  # safetensors, as a coordinator would
    resumed = make()
    resumed.load_state_dict(decode_state(checkpoint)[0])
    y = x1
    for updates in rounds[1:]:
        y = resumed.aggregate(y, updates)
    for name in x:
        assert torch.equal(x[name], y[name]), name
    assert straight.state_dict().keys() == resumed.state_dict().keys()
    for key, tensor in straight.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[key]), key

    # without the state, the result differs: the state really matters
    fresh = make()
    z = x1
    for updates in rounds[1:]:
        z = fresh.aggregate(z, updates)
    assert not torch.equal(z["a"], x["a"])


def test_load_state_dict_validates() -> None:
    with pytest.raises(ValueError, match="keeps no state"):
        FedAvg().load_state_dict({"m.w": torch.zeros(1)})
    FedAvg().load_state_dict({})
    with pytest.raises(ValueError, match="step"):
        FedAdam().load_state_dict({"m.w": torch.zeros(3), "v.w": torch.zeros(3)})
    with pytest.raises(ValueError, match="unexpected key"):
        DiLoCo().load_state_dict({"step": torch.tensor(1), "m.w": torch.zeros(3)})
    with pytest.raises(ValueError, match="different tensors"):
        FedAdam().load_state_dict({"step": torch.tensor(1), "m.w": torch.zeros(3)})
    strategy = FedAdam()
    strategy.load_state_dict(
        {"step": torch.tensor(1), "m.w": torch.zeros(2), "v.w": torch.zeros(2)}
    )
    with pytest.raises(ValueError, match="shape"):
        strategy.aggregate(X0, [cu("a", s(1, 2, 3))])
    assert FedAdam().state_dict() == {}


ALL = [
    lambda: FedAvg(0.5),
    lambda: FedProx(0.1, 0.5),
    lambda: FedAdam(0.1),
    lambda: DiLoCo(0.7, 0.9),
    lambda: TrimmedMean(0.2),
    lambda: Median(),
    lambda: MultiKrum(1),
]


@pytest.mark.parametrize("make", ALL, ids=lambda f: type(f()).__name__)
def test_strategies_do_not_mutate_inputs(make) -> None:  # type: ignore[no-untyped-def]
    strategy: Strategy = make()
    updates = random_rounds(11, 2)[0] + random_rounds(12, 2)[1]  # 6 updates
    x = {"a": torch.zeros(3, 2), "b": torch.ones(4)}
    x_copy = {k: v.clone() for k, v in x.items()}
    deltas = [{k: v.clone() for k, v in u.delta.items()} for u in updates]
    for _ in range(2):
        new = strategy.aggregate(x, updates)
    for k in x:
        assert torch.equal(x[k], x_copy[k])
        assert new[k].dtype == x[k].dtype and new[k].data_ptr() != x[k].data_ptr()
    for u, d in zip(updates, deltas, strict=True):
        for k in d:
            assert torch.equal(u.delta[k], d[k])


def test_build_strategy_from_spec() -> None:
    cases = {
        "fedavg": FedAvg,
        "fedprox": FedProx,
        "fedadam": FedAdam,
        "diloco": DiLoCo,
        "trimmed_mean": TrimmedMean,
        "median": Median,
        "krum": MultiKrum,
    }
    for name, cls in cases.items():
        strategy = build_strategy(AggregationSpec(strategy=name, server_lr=0.3))
        assert type(strategy) is cls
        assert strategy.params()["strategy"] == name == strategy.name
        assert strategy.params()["server_lr"] == 0.3
    prox = build_strategy(AggregationSpec(strategy="fedprox", mu=0.25))
    assert prox.proximal_mu == 0.25
    adam = build_strategy(AggregationSpec(strategy="fedadam", beta1=0.8, beta2=0.95, tau=0.01))
    assert adam.params() == {
        "strategy": "fedadam",
        "server_lr": 1.0,
        "beta1": 0.8,
        "beta2": 0.95,
        "tau": 0.01,
    }
    krum = build_strategy(AggregationSpec(strategy="krum", byzantine=3, krum_select=4))
    assert krum.params()["byzantine"] == 3 and krum.params()["select"] == 4


def test_constructors_validate_hyper_parameters() -> None:
    with pytest.raises(ValueError, match="server_lr"):
        FedAvg(server_lr=0)
    with pytest.raises(ValueError, match="beta1"):
        FedAdam(beta1=1.0)
    with pytest.raises(ValueError, match="tau"):
        FedAdam(tau=0)
    with pytest.raises(ValueError, match="momentum"):
        DiLoCo(momentum=1.0)
    with pytest.raises(ValueError, match="trim_fraction"):
        TrimmedMean(trim_fraction=0.5)
    with pytest.raises(ValueError, match="byzantine"):
        MultiKrum(byzantine=-1)
    with pytest.raises(ValueError, match="mu"):
        FedProx(mu=-0.1)
