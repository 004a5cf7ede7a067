"""trainer.rounds: closing a round, as the simulators and the marketplace all do it."""

from __future__ import annotations

import torch
from torch import nn

from trainer.aggregation import ClientUpdate, build_strategy
from trainer.datasets import Dataset
from trainer.provenance import ProvenanceChain, verify_chain
from trainer.rounds import checkpoint_after, close_round, statistical_filter
from trainer.spec import AggregationSpec, TargetSpec


def test_the_filter_drops_an_update_pointing_away_from_the_median() -> None:
    good = {"w": torch.ones(10)}
    deltas = [good, good, {"w": torch.ones(10) * 1.1}, {"w": -10 * torch.ones(10)}]
    kept, dropped, cosines = statistical_filter(deltas, -0.25)
    assert kept == [0, 1, 2] and set(dropped) == {3} and dropped[3] < 0
    assert len(cosines) == 4 and min(cosines[i] for i in kept) > 0.99
    assert statistical_filter(deltas, None)[0] == [0, 1, 2, 3]
    assert statistical_filter(deltas[2:], -0.25)[0] == [0, 1]  # two: nothing to judge by


def _data() -> Dataset:
    x = torch.eye(4)
    y = torch.tensor([0, 1, 0, 1])
    return Dataset(name="t", task="classification", x_train=x, y_train=y, x_test=x, y_test=y,
                   num_classes=2, input_shape=(4,))  # fmt: skip


def test_close_round_aggregates_the_kept_updates_evaluates_and_records() -> None:
    model = nn.Linear(4, 2)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    right = {"weight": torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1]]), "bias": torch.zeros(2)}
    attack = {k: -50 * v for k, v in right.items()}
    updates = [
        (ClientUpdate(f"n{i}", delta, 10, {}), f"shard-{i}")
        for i, delta in enumerate([right, right, right, attack])
    ]
    chain = ProvenanceChain("job")
    strategy = build_strategy(AggregationSpec(strategy="fedavg"))
    closed = close_round(
        number=1, global_state=start, updates=updates, strategy=strategy, model=model,
        dataset=_data(), chain=chain, target=TargetSpec(metric="accuracy", value=1.0),
    )  # fmt: skip
    assert closed.kept == [0, 1, 2] and list(closed.dropped) == [3]
    assert torch.equal(closed.state["weight"], right["weight"])  # the mean of three equals
    assert closed.evaluation.accuracy == 1.0 and closed.reached_target
    assert [c.node_id for c in closed.record.contributions] == ["n0", "n1", "n2"]
    assert verify_chain(chain).ok and len(chain) == 1
    ckpt = checkpoint_after(closed, number=1, spec={"name": "t"}, strategy=strategy,
                            chain=chain, history=[closed.metrics], seed=7)  # fmt: skip
    assert ckpt.round == 1 and ckpt.model_state is closed.state
    assert ckpt.extra["reached_target"] is True and ckpt.rng == {"seed": 7}
