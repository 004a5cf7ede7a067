"""`rounds.mode: naive`: naive synchronous training as a job spec setting (one local step per
round, every node, nothing compressed), parsed once, and run by the simulator as the
marketplace runs it."""

from pathlib import Path

import pytest

from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.setup import prepare
from trainer.spec import SpecError, load_spec, parse_spec
from trainer.updates import encode_state

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.yaml"


def _naive(**extra) -> dict:
    data = load_spec(DIGITS).to_dict()
    for section in ("local", "compression", "adaptation"):
        data.pop(section, None)
    data["rounds"] = {"mode": "naive", "max_rounds": 2} | extra.pop("rounds", {})
    return data | extra


def test_naive_mode_fills_in_one_step_every_node_uncompressed() -> None:
    spec = parse_spec(_naive())
    assert spec.rounds.mode == "naive"
    assert spec.local.steps == 1 and spec.local.epochs is None
    assert spec.rounds.quorum == 1.0 and spec.rounds.late_updates == "drop"
    assert spec.compression.codec == "none" and spec.compression.download_codec == "none"
    assert not spec.adaptation.enabled
    assert parse_spec(spec.to_dict()) == spec  # what the marketplace stores parses the same
    assert parse_spec(load_spec(DIGITS).to_dict()).rounds.mode == "federated"


@pytest.mark.parametrize(
    ("section", "value", "named"),
    [
        ("local", {"steps": 8}, "local.steps"),
        ("local", {"epochs": 1}, "local.epochs"),
        ("compression", {"codec": "int8"}, "compression.codec"),
        ("adaptation", {"enabled": True}, "adaptation.enabled"),
        ("rounds", {"quorum": 0.5}, "rounds.quorum"),
    ],
)
def test_settings_that_contradict_naive_mode_are_refused(section, value, named) -> None:
    data = _naive()
    data[section] = {**data.get(section, {}), **value}
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    assert named in str(refused.value) and "rounds.mode naive" in str(refused.value)


def test_the_simulator_runs_naive_mode_one_step_on_every_node() -> None:
    spec = parse_spec(_naive())
    setup = prepare(spec, 3, "lan", 0)
    result, state = run_federated(setup, RunOptions(max_rounds=2), method="naive")
    assert [log.participants for log in result.log] == [3, 3]
    whole = len(encode_state(state))
    for log in result.log:
        # every node sends a whole fp32 update and fetches the whole model, every round
        assert log.bytes_down == 3 * whole
        assert log.bytes_up >= 3 * whole * 0.9
