from pathlib import Path

import pytest

from trainer.spec import SpecError, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_validates(path: Path) -> None:
    spec = load_spec(path)
    assert spec.name


def test_digits_example_is_the_documented_mlp() -> None:
    spec = load_spec(EXAMPLES / "digits-mlp.yaml")
    assert spec.model.arch == "mlp" and spec.model.hidden == [128]
    assert spec.dataset.kind == "digits"
    assert spec.rounds.target is not None and spec.rounds.target.value == 0.95


def _problems(data: object) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return dict(info.value.problems)


def test_unknown_key_is_an_error_naming_its_path() -> None:
    problems = _problems({"name": "x", "optimizer": {"name": "sgd", "learning_rate": 0.1}})
    assert problems == {"optimizer.learning_rate": "unknown key"}


def test_wrong_values_name_field_path_and_reason() -> None:
    problems = _problems({"name": "x", "optimizer": {"lr": -1}, "local": {"batch_size": 0}})
    assert "optimizer.lr" in problems and "greater than 0" in problems["optimizer.lr"]
    assert "local.batch_size" in problems


def test_local_needs_exactly_one_of_steps_or_epochs() -> None:
    assert "exactly one" in _problems({"name": "x", "local": {"steps": 3, "epochs": 1}})["local"]
    assert "exactly one" in _problems({"name": "x", "local": {"batch_size": 8}})["local"]


def test_user_dataset_needs_a_path() -> None:
    assert "needs a 'path'" in _problems({"name": "x", "dataset": {"kind": "csv"}})["dataset"]


def test_accuracy_target_out_of_range() -> None:
    problems = _problems({"name": "x", "rounds": {"target": {"metric": "accuracy", "value": 95}}})
    assert "(0, 1]" in problems["rounds.target"]


def test_missing_name_and_non_mapping() -> None:
    assert "name" in _problems({})
    assert "<root>" in _problems(["not", "a", "mapping"])


def test_transformer_heads_must_divide_width() -> None:
    problems = _problems({"name": "x", "model": {"arch": "transformer", "d_model": 30}})
    assert "divisible" in problems["model"]


def test_noise_without_clip_is_rejected() -> None:
    assert "clip_norm" in _problems({"name": "x", "privacy": {"noise_multiplier": 1.0}})["privacy"]


def test_load_spec_reports_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    js = tmp_path / "job.json"
    js.write_text('{"name": "j", "seed": 3}')
    assert load_spec(js).seed == 3


def test_spec_round_trips_through_its_dict() -> None:
    spec = load_spec(EXAMPLES / "digits-mlp.yaml")
    assert parse_spec(spec.to_dict()) == spec
    assert spec.replace(seed=5).seed == 5


@pytest.mark.parametrize(
    ("sharding", "reshards"),
    [
        ({}, False),
        ({"method": "random"}, False),
        ({"method": "random", "elastic": True}, True),
        ({"method": "capability"}, True),  # throughput means something once nodes are known
    ],
)
def test_elastic_sharding_defaults_off_and_capability_implies_it(sharding, reshards) -> None:
    spec = parse_spec({"name": "x", "sharding": sharding})
    assert spec.sharding.elastic is sharding.get("elastic", False)
    assert spec.sharding.reshards is reshards


def test_elastic_must_be_a_boolean() -> None:
    with pytest.raises(SpecError, match=r"sharding\.elastic"):
        parse_spec({"name": "x", "sharding": {"elastic": "sometimes"}})


def test_precision_accumulation_and_checkpointing_defaults() -> None:
    spec = parse_spec({"name": "x"})
    assert spec.local.precision == "auto" and spec.local.grad_accum_steps == 1
    assert spec.model.checkpointing is False
    spec = parse_spec(
        {
            "name": "x",
            "local": {"steps": 5, "batch_size": 64, "precision": "bf16", "grad_accum_steps": 4},
            "model": {"arch": "transformer", "checkpointing": True},
        }
    )
    assert spec.local.precision == "bf16" and spec.local.grad_accum_steps == 4
    assert spec.model.checkpointing


def test_precision_accumulation_and_checkpointing_errors_name_the_field() -> None:
    problems = _problems(
        {
            "name": "x",
            "local": {"steps": 5, "precision": "fp8", "grad_accum_steps": 0},
            "model": {"checkpointing": "sometimes"},
        }
    )
    assert "'auto', 'fp32', 'bf16' or 'fp16'" in problems["local.precision"]
    assert "greater than or equal to 1" in problems["local.grad_accum_steps"]
    assert "model.checkpointing" in problems
    too_many = _problems(
        {"name": "x", "local": {"steps": 5, "batch_size": 8, "grad_accum_steps": 9}}
    )
    assert "grad_accum_steps (9) must not exceed batch_size (8)" in too_many["local"]
