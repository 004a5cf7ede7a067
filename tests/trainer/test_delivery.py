"""trainer.delivery: the canonical chain of delta-delivered models, in close_round, the
provenance replay and checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainer.aggregation import ClientUpdate, build_strategy
from trainer.artifacts import ArtifactStore
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.compression import CodecConfig, error_bound
from trainer.datasets import Dataset
from trainer.delivery import apply_delta, deliver_step, delivery_codec
from trainer.hashing import state_hash
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.rounds import checkpoint_after, close_round
from trainer.spec import AggregationSpec, parse_spec
from trainer.updates import UpdateRejected, encode_state

INT8 = CodecConfig("int8", 64)


def _state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(40, 30, generator=gen), "b": torch.randn(30, generator=gen)}


def test_a_node_rebuilds_the_canonical_model_bit_for_bit() -> None:
    base, target = _state(0), {k: v + 0.01 for k, v in _state(0).items()}
    step = deliver_step(base, target, INT8)
    rebuilt = apply_delta(base, step.payload)
    assert state_hash(rebuilt) == state_hash(step.state)
    whole = len(encode_state(target))
    assert len(step.payload) < whole / 3  # int8: about a quarter of fp32
    # the encoding error is what the residual carries, and stays within one int8 step
    for k in base:
        assert torch.allclose(step.state[k] + step.residual[k], target[k], atol=1e-6)
    bound = error_bound(INT8, {k: target[k] - base[k] for k in base})
    assert (torch.cat([step.residual[k].reshape(-1) for k in sorted(base)]).abs() <= bound).all()


def test_error_feedback_keeps_the_chain_on_the_aggregate() -> None:
    """Without the residual the quantization error would add up over rounds; with it the
    canonical model stays within one step's error of the true trajectory."""
    gen = torch.Generator().manual_seed(1)
    truth, canonical, residual = _state(2), _state(2), None
    plain = _state(2)  # the same chain without error feedback
    for _ in range(30):
        move = {k: 0.003 * torch.randn(v.shape, generator=gen) + 0.001 for k, v in truth.items()}
        target = {k: canonical[k] + move[k] for k in truth}
        truth = {k: truth[k] + move[k] for k in truth}
        step = deliver_step(canonical, target, INT8, residual)
        canonical, residual = step.state, step.residual
        plain = deliver_step(plain, {k: plain[k] + move[k] for k in plain}, INT8).state
    fed = max(float((truth[k] - canonical[k]).abs().max()) for k in truth)
    drifted = max(float((truth[k] - plain[k]).abs().max()) for k in truth)
    assert fed < 2e-4 and drifted > 2 * fed


def test_a_corrupt_or_foreign_delta_is_refused() -> None:
    base = _state(0)
    payload = deliver_step(base, _state(1), INT8).payload
    with pytest.raises(UpdateRejected):
        apply_delta(base, payload[: len(payload) // 2])  # truncated on the way
    with pytest.raises(UpdateRejected):
        apply_delta({"w": torch.zeros(5, 5), "b": torch.zeros(30)}, payload)  # another model


def test_which_jobs_get_deltas() -> None:
    base = {"name": "t", "dataset": {"kind": "digits"}, "model": {"arch": "mlp"}}
    assert delivery_codec(parse_spec(base)) is None  # plain FedAvg: whole fp32 models
    adaptive = parse_spec(base | {"adaptation": {"enabled": True}})
    assert delivery_codec(adaptive) == CodecConfig("int8", 256)
    fp16 = parse_spec(base | {"compression": {"download_codec": "fp16", "block_size": 128}})
    assert delivery_codec(fp16) == CodecConfig("fp16", 128)
    off = parse_spec(base | {"adaptation": {"enabled": True},
                             "compression": {"download_codec": "none"}})  # fmt: skip
    assert delivery_codec(off) is None


def _data() -> Dataset:
    x = torch.eye(4)
    y = torch.tensor([0, 1, 0, 1])
    return Dataset(name="t", task="classification", x_train=x, y_train=y, x_test=x, y_test=y,
                   num_classes=2, input_shape=(4,))  # fmt: skip


def test_delivered_rounds_replay_and_resume(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    strategy = build_strategy(AggregationSpec(strategy="fedavg"))
    chain, store = ProvenanceChain("job"), ArtifactStore(tmp_path / "artifacts")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    residual = None
    gen = torch.Generator().manual_seed(0)
    for number in (1, 2, 3):
        deltas = [{k: torch.randn(v.shape, generator=gen) * 0.1 for k, v in state.items()}
                  for _ in range(3)]  # fmt: skip
        updates = [(ClientUpdate(f"n{i}", d, 10), f"s{i}") for i, d in enumerate(deltas)]
        closed = close_round(
            number=number, global_state=state, updates=updates, strategy=strategy,
            model=model, dataset=_data(), chain=chain, store=store, min_cosine=None,
            delivery=CodecConfig("int8", 8), residual=residual,
        )  # fmt: skip
        assert closed.delta is not None and closed.residual is not None
        assert state_hash(apply_delta(state, closed.delta)) == state_hash(closed.state)
        assert closed.record.delivery is not None
        assert closed.record.output_model_hash == state_hash(closed.state)
        state, residual = closed.state, closed.residual
    report = verify_with_artifacts(chain, store, AggregationSpec(strategy="fedavg"))
    assert report.ok, report.problems
    assert report.rounds_replayed == 3

    # the residual is coordinator state: a resumed job carries it on from the checkpoint
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, checkpoint_after(closed, number=3, spec={"name": "t"},
                                           strategy=strategy, chain=chain, history=[],
                                           seed=0))  # fmt: skip
    loaded = load_checkpoint(path)
    assert set(loaded.residual) == set(residual)
    assert all(torch.equal(loaded.residual[k], residual[k]) for k in residual)

    # a tampered residual no longer reproduces the recorded model
    last = chain.records[-1]
    assert last.delivery is not None
    store.put_state({k: v + 1 for k, v in store.get_state(last.delivery["residual_hash"]).items()})
    forged = ProvenanceChain.from_json(chain.to_json().replace(
        last.delivery["residual_hash"],
        state_hash({k: v + 1 for k, v in store.get_state(last.delivery["residual_hash"]).items()}),
    ))  # fmt: skip
    bad = verify_with_artifacts(forged, store, AggregationSpec(strategy="fedavg"))
    assert not bad.ok
    assert any("output model hash mismatch" in p for p in bad.problems)


def test_a_round_without_updates_keeps_the_model_and_sends_nothing() -> None:
    model = nn.Linear(4, 2)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    closed = close_round(
        number=1, global_state=state, updates=[], model=model, dataset=_data(),
        strategy=build_strategy(AggregationSpec(strategy="fedavg")), chain=ProvenanceChain("j"),
        delivery=INT8,
    )  # fmt: skip
    assert closed.delta is None and state_hash(closed.state) == state_hash(state)
