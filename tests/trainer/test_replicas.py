"""The replica agreement rule: honest replicas in different precisions agree, cheats do not,
whatever precision the cheater claims. Updates come from real local training (train_local)
and travel through the int8 codec, as replicated tasks do."""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

from trainer.compression import CodecConfig, decode_any, encode_update
from trainer.datasets import Dataset, load_digits_dataset, load_text_dataset
from trainer.local import derive_seed, train_local
from trainer.models import build_model
from trainer.replicas import (
    CROSS_DEVICE_TOLERANCE,
    PRECISIONS,
    SAME_DEVICE_TOLERANCE,
    agreement,
    claimed_precision,
    distance,
)
from trainer.sharding import plan_shards
from trainer.spec import JobSpec, parse_spec
from trainer.updates import UpdateRejected

State = dict[str, Tensor]


@dataclass
class Unit:
    """One replicated unit at round 1, and what a cheater could send instead of working."""

    global_state: State
    fp32: State  # honest uploads of shard 0, after the int8 round trip
    bf16: State
    fp32_again: State
    raw: State  # shard 0's honest update before the codec
    other_shard: State  # shard 1's honest update, same round
    previous: State  # shard 0's honest update from round 0


def _travel(update: State, reference: State) -> State:
    decoded, _ = decode_any(encode_update(update, CodecConfig("int8")), reference)
    return decoded


def _train(model, start: State, data: Dataset, spec: JobSpec, seed: int, precision: str) -> State:
    local = spec.local.model_dump() | {"precision": precision}
    result = train_local(model, start, data, spec.replace(local=local), seed=seed)
    assert result.precision == precision
    return result.delta


def _unit(spec: JobSpec, data: Dataset) -> Unit:
    """Round 0 in fp32 on 4 shards (FedAvg), then shard 0's task of round 1 in both
    precisions: the unit is measured from a model that has trained, not only from init."""
    shards = [data.subset(torch.from_numpy(s.indices)) for s in plan_shards(data, 4, seed=0)]
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    round0 = [
        _train(model, start, shard, spec, derive_seed(0, 0, i), "fp32")
        for i, shard in enumerate(shards)
    ]
    state = {k: start[k] + sum(d[k] for d in round0) / len(round0) for k in start}
    seed = derive_seed(0, 1, 0)
    raw = _train(model, state, shards[0], spec, seed, "fp32")
    return Unit(
        global_state=state,
        fp32=_travel(raw, state),
        bf16=_travel(_train(model, state, shards[0], spec, seed, "bf16"), state),
        fp32_again=_travel(_train(model, state, shards[0], spec, seed, "fp32"), state),
        raw=raw,
        other_shard=_train(model, state, shards[1], spec, derive_seed(0, 1, 1), "fp32"),
        previous=round0[0],
    )


@pytest.fixture(scope="module")
def mlp_unit() -> Unit:
    """examples/digits-mlp.yaml's model and optimizer, 1 epoch of a quarter of digits."""
    spec = parse_spec(
        {
            "name": "replicas-mlp",
            "model": {"arch": "mlp", "hidden": [64]},
            "optimizer": {"name": "sgd", "lr": 0.2},
            "local": {"epochs": 1, "batch_size": 32},
        }
    )
    return _unit(spec, load_digits_dataset(0.2, 0))


@pytest.fixture(scope="module")
def transformer_unit(tmp_path_factory: pytest.TempPathFactory) -> Unit:
    """A small byte transformer with AdamW on Python source (the standard library's own)."""
    source = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    corpus = tmp_path_factory.mktemp("text") / "corpus.txt"
    corpus.write_bytes(source.read_bytes()[:12_000])
    spec = parse_spec(
        {
            "name": "replicas-lm",
            "dataset": {"kind": "text", "path": str(corpus), "seq_len": 32},
            "model": {"arch": "transformer", "d_model": 32, "n_layers": 1, "n_heads": 2},
            "optimizer": {"name": "adamw", "lr": 0.003},
            "local": {"epochs": 1, "batch_size": 16},
        }
    )
    return _unit(spec, load_text_dataset(corpus, 32, 0.2, 0))


@pytest.fixture(params=["mlp", "transformer"])
def unit(request: pytest.FixtureRequest) -> Unit:
    return request.getfixturevalue(f"{request.param}_unit")


def test_honest_fp32_and_bf16_replicas_agree(unit: Unit) -> None:
    verdict = agreement(unit.fp32, unit.bf16, "fp32", "bf16")
    assert verdict.agreed and not verdict.same_class
    assert verdict.tolerance == CROSS_DEVICE_TOLERANCE
    # bf16 really did run: not bit-identical, and too far apart for a bit-exact rule
    assert verdict.distance.relative_l2 > SAME_DEVICE_TOLERANCE
    assert verdict.distance.cosine > 0.99


def test_the_same_task_twice_on_one_device_is_bit_identical(unit: Unit) -> None:
    verdict = agreement(
        unit.fp32, unit.fp32_again, "fp32", "fp32", same_class_tolerance=SAME_DEVICE_TOLERANCE
    )
    assert verdict.agreed and verdict.distance.relative_l2 == 0.0


def _cheats(unit: Unit) -> dict[str, State]:
    gen = torch.Generator().manual_seed(0)

    def noise(t: Tensor) -> Tensor:
        z = torch.randn(t.shape, generator=gen)
        return z * t.norm() / z.norm()

    return {
        "noise of the honest norm": {k: noise(v) for k, v in unit.raw.items()},
        "sign flip": {k: -v for k, v in unit.raw.items()},
        "copy of another shard's update": unit.other_shard,
        "stale: last round's update of this shard": unit.previous,
        "zero": {k: torch.zeros_like(v) for k, v in unit.raw.items()},
        "scaled x2": {k: 2 * v for k, v in unit.raw.items()},
        "scaled x0.5": {k: 0.5 * v for k, v in unit.raw.items()},
    }


@pytest.mark.parametrize("honest_claim", ["fp32", "bf16"])
def test_every_cheat_is_rejected_whatever_precision_it_claims(
    unit: Unit, honest_claim: str
) -> None:
    honest = unit.fp32 if honest_claim == "fp32" else unit.bf16
    for name, cheat in _cheats(unit).items():
        upload = _travel(cheat, unit.global_state)
        for claim in PRECISIONS:
            verdict = agreement(honest, upload, honest_claim, claim)
            assert not verdict.agreed, (name, claim, verdict.distance.relative_l2)


def test_differing_claims_are_never_held_tighter_than_the_cross_device_tolerance() -> None:
    a = {"w": torch.ones(100)}
    b = {"w": torch.ones(100) * 1.1}  # relative L2 0.09: an honest cross-precision distance
    tight = SAME_DEVICE_TOLERANCE
    assert not agreement(a, b, "bf16", "bf16", same_class_tolerance=tight).agreed
    assert agreement(a, b, "bf16", "fp32", same_class_tolerance=tight).agreed
    assert agreement(a, b, "bf16", "bf16").agreed  # the default: cross-device for everyone
    loose = agreement(a, {"w": torch.ones(100) * 2}, "fp32", "fp16", same_class_tolerance=0.6)
    assert loose.agreed and loose.tolerance == 0.6  # an operator's looser setting counts too


def test_distance_over_the_whole_update_and_per_tensor() -> None:
    a = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    d = distance(a, {"w": -a["w"], "b": torch.tensor([0.0])})
    assert d.relative_l2 == pytest.approx(2.0) and d.cosine == pytest.approx(-1.0)
    assert d.per_tensor == {"b": 0.0, "w": pytest.approx(2.0)} and d.worst_tensor == "w"
    zero = {"w": torch.zeros(2)}
    assert distance(zero, zero).relative_l2 == 0.0 and distance(zero, zero).cosine == 0.0
    assert distance(zero, {"w": torch.ones(2)}).relative_l2 == 1.0
    with pytest.raises(ValueError, match="differ in tensors"):
        distance(a, {"w": a["w"]})


def test_claimed_precision_from_upload_metadata() -> None:
    assert claimed_precision({"task_id": "x"}) == "fp32"  # agents before mixed precision
    assert [claimed_precision({"precision": p}) for p in PRECISIONS] == list(PRECISIONS)
    for bad in ("fp8", "BF16", "", "tf32"):
        with pytest.raises(UpdateRejected, match="unknown precision") as info:
            claimed_precision({"precision": bad})
        assert info.value.reason == "metadata"


def test_agreement_rejects_unknown_claims_and_tolerances() -> None:
    a = {"w": torch.ones(3)}
    with pytest.raises(ValueError, match="unknown precision"):
        agreement(a, a, "fp32", "fp8")
    with pytest.raises(ValueError, match="tolerance"):
        agreement(a, a, "fp32", "fp32", same_class_tolerance=float("nan"))
