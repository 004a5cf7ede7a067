"""desktop.task_runner on its own (in-process): the checks it makes on both sides of training."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fake_marketplace import FakeTask, digits_task

from desktop import task_runner
from trainer.updates import decode_state


def _folder(tmp_path: Path, t: FakeTask) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "task.json").write_text(json.dumps(t.task))
    (tmp_path / "model.safetensors").write_bytes(t.model)
    (tmp_path / "shard.safetensors").write_bytes(t.shard)
    return tmp_path


def _result(folder: Path) -> dict:
    return json.loads((folder / "result.json").read_text())


def test_a_sound_task_trains_and_hands_over_its_update(tmp_path: Path) -> None:
    folder = _folder(tmp_path, digits_task("t-1", steps=3))
    assert task_runner.run(folder) == task_runner.EXIT_OK
    assert _result(folder)["status"] == "ok" and (folder / "update.safetensors").is_file()


def test_inputs_that_do_not_match_the_task_hashes_are_corrupt_input(tmp_path: Path) -> None:
    t = digits_task("t-2", steps=3)
    t.model = t.model[:-1] + bytes([t.model[-1] ^ 0xFF])
    folder = _folder(tmp_path / "model", t)
    assert task_runner.run(folder) == task_runner.EXIT_BAD_INPUT
    assert _result(folder) == {"status": "failed", "reason": task_runner.CORRUPT_INPUT,
                               "detail": "model.safetensors does not match the task's "
                                         "content hash"}  # fmt: skip
    t = digits_task("t-3", steps=3)
    t.shard = t.shard[: len(t.shard) // 2]  # a cut-off download
    folder = _folder(tmp_path / "shard", t)
    assert task_runner.run(folder) == task_runner.EXIT_BAD_INPUT
    assert _result(folder)["reason"] == task_runner.CORRUPT_INPUT
    assert not (folder / "update.safetensors").exists()


def test_an_update_the_server_would_reject_is_never_handed_over(tmp_path: Path) -> None:
    t = digits_task("t-4", steps=3)
    t.task["spec"]["aggregation"] = {"max_update_norm": 1e-9}
    folder = _folder(tmp_path, t)
    assert task_runner.run(folder) == task_runner.EXIT_CRASHED
    result = _result(folder)
    assert result["reason"] == "crashed" and "unusable update" in result["detail"], result
    assert "norm" in result["detail"]
    assert not (folder / "update.safetensors").exists()


def _delta(folder: Path) -> dict:
    return decode_state((folder / "update.safetensors").read_bytes())[0]


def test_a_byzantine_node_flips_or_noises_the_update_it_would_have_sent(
    tmp_path: Path, monkeypatch
) -> None:
    """`desktop.fault_injection --byzantine`: the runner is deterministic for a task, so the
    attacked update is exactly the honest one, flipped and scaled or with seeded noise added."""
    honest = _folder(tmp_path / "honest", digits_task("t-5", steps=3))
    assert task_runner.run(honest) == task_runner.EXIT_OK
    good = _delta(honest)
    monkeypatch.setenv(task_runner.BYZANTINE_ENV, "sign_flip:10.0")
    flipped = _folder(tmp_path / "flip", digits_task("t-5", steps=3))
    assert task_runner.run(flipped) == task_runner.EXIT_OK
    assert _result(flipped)["status"] == "ok"  # passed the runner's own update checks
    for name, v in _delta(flipped).items():
        torch.testing.assert_close(v, -10.0 * good[name])

    monkeypatch.setenv(task_runner.BYZANTINE_ENV, "noise")  # the default scale: 30
    noisy = [_folder(tmp_path / f"noise{i}", digits_task("t-5", steps=3)) for i in (1, 2)]
    assert all(task_runner.run(f) == task_runner.EXIT_OK for f in noisy)
    first, again = _delta(noisy[0]), _delta(noisy[1])
    assert all(torch.equal(v, again[k]) for k, v in first.items())  # seeded by the task

    def norm(state: dict) -> float:
        return float(sum(v.double().square().sum() for v in state.values()) ** 0.5)

    ratio = norm({k: v - good[k] for k, v in first.items()}) / norm(good)
    assert 27 < ratio < 33, ratio  # noise of about 30 x the update's norm

    monkeypatch.setenv(task_runner.BYZANTINE_ENV, "poison")
    bad = _folder(tmp_path / "bad", digits_task("t-5", steps=3))
    assert task_runner.run(bad) == task_runner.EXIT_BAD_INPUT
    assert "unknown attack 'poison'" in _result(bad)["detail"]


def _without_model(tmp_path: Path, t: FakeTask) -> Path:
    folder = _folder(tmp_path, t)
    (folder / "model.safetensors").unlink()
    return folder


def test_round_one_is_built_from_the_seed_and_checked(tmp_path: Path) -> None:
    """model_source "seed": no download; the runner builds build_model(spec, seed) and checks
    it against the task's model hash, then leaves it for the agent's input cache."""
    t = digits_task("t-seed", steps=3)
    t.task["model_source"] = {"kind": "seed", "input_shape": [64], "num_classes": 10}
    folder = _without_model(tmp_path / "ok", t)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    from trainer.hashing import state_hash

    assert (
        state_hash(decode_state((folder / "model.safetensors").read_bytes())[0])
        == (t.task["model_hash"])
    )
    t.task["spec"]["seed"] = 5  # another seed builds other weights: caught, fetched whole
    folder = _without_model(tmp_path / "other-seed", t)
    assert task_runner.run(folder) == task_runner.EXIT_BAD_INPUT
    result = _result(folder)
    assert result["reason"] == task_runner.CORRUPT_INPUT
    assert "built from the job's seed does not match" in result["detail"]


def test_a_model_rebuilt_from_deltas_trains_like_the_whole_one(tmp_path: Path) -> None:
    from trainer.compression import CodecConfig
    from trainer.delivery import deliver_step
    from trainer.hashing import state_hash
    from trainer.updates import encode_state

    t = digits_task("t-delta", steps=3)
    base = t.reference
    gen = torch.Generator().manual_seed(0)
    steps, state = [], base
    for _ in range(2):  # two rounds behind: a chain of two deltas
        target = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
        step = deliver_step(state, target, CodecConfig("int8", 256))
        steps.append(step.payload)
        state = step.state
    whole = digits_task("t-delta", steps=3)
    whole.model, whole.task["model_hash"] = encode_state(state), state_hash(state)
    expected = _folder(tmp_path / "whole", whole)
    assert task_runner.run(expected) == task_runner.EXIT_OK

    t.task["model_hash"] = state_hash(state)
    t.task["model_source"] = {"kind": "delta", "base": state_hash(base), "chain": ["a", "b"]}
    folder = _without_model(tmp_path / "delta", t)
    (folder / "model.base.safetensors").write_bytes(encode_state(base))
    for i, payload in enumerate(steps):
        (folder / f"model.delta.{i}.safetensors").write_bytes(payload)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    got, want = _delta(folder), _delta(expected)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

    (folder / "model.safetensors").unlink()
    (folder / "model.delta.1.safetensors").unlink()  # one step short of the round's model
    assert task_runner.run(folder) == task_runner.EXIT_BAD_INPUT
    result = _result(folder)
    assert result["reason"] == task_runner.CORRUPT_INPUT
    assert "rebuilt from 1 delta(s) does not match" in result["detail"]


def _scoring_task(tmp_path: Path, kind: str, rows: int = 300) -> tuple[Path, FakeTask]:
    t = digits_task(f"t-{kind}", rows=rows)
    t.task["kind"] = kind
    t.task["spec"] |= {"kind": kind, "model": t.task["spec"]["model"] | {"checkpoint": "c"}}
    return _folder(tmp_path, t), t


def test_an_evaluate_task_hands_over_its_exact_sums(tmp_path: Path) -> None:
    from trainer.scoring import ScoreSums, score

    folder, t = _scoring_task(tmp_path, "evaluate")
    assert task_runner.run(folder) == task_runner.EXIT_OK
    assert _result(folder)["status"] == "ok" and _result(folder)["metrics"]["samples"] == 300
    sums = ScoreSums.from_bytes((folder / "update.safetensors").read_bytes(), expected_count=300)
    model = _built(t)
    shard = decode_state(t.shard)[0]
    assert sums == score(model, shard["x"], shard["y"], "classification")


def test_an_inference_task_hands_over_its_predictions(tmp_path: Path) -> None:
    from trainer.scoring import Predictions, predict

    folder, t = _scoring_task(tmp_path, "inference", rows=20)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    got = Predictions.from_bytes((folder / "update.safetensors").read_bytes(), 20, 10)
    expected = predict(_built(t), decode_state(t.shard)[0]["x"])
    assert torch.equal(got.labels, expected.labels) and torch.equal(got.probs, expected.probs)


def _built(t: FakeTask):
    from trainer.models import build_model
    from trainer.spec import parse_spec

    model = build_model(parse_spec(t.task["spec"]).model, (64,), 10, seed=0)
    model.load_state_dict(t.reference)
    return model


def _meta(folder: Path) -> dict:
    return decode_state((folder / "update.safetensors").read_bytes())[1]


def test_a_task_commits_to_its_boundary_checkpoints(tmp_path: Path) -> None:
    """Proof of learning (trainer.proof): the update's metadata carries the commitments to the
    checkpoints the folder keeps, and the chain is the task's run from the model to the update."""
    from trainer.proof import check_binding
    from trainer.proof_commitment import commitment
    from trainer.resume import PausedState

    t = digits_task("t-p", steps=8)
    folder = _folder(tmp_path, t)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    meta = _meta(folder)
    bounds, hashes = json.loads(meta["boundaries"]), json.loads(meta["commitments"])
    assert bounds == [0, 2, 4, 6, 8] and _result(folder)["proof"]["commitments"] == hashes
    kept = [(folder / task_runner.CHECKPOINT.format(b)).read_bytes() for b in bounds]
    assert [commitment(b) for b in kept] == hashes
    first, last = PausedState.from_bytes(kept[0]), PausedState.from_bytes(kept[-1])
    model = decode_state((folder / "model.safetensors").read_bytes())[0]
    assert check_binding(first, last, model, _delta(folder)) is None


def test_lazy_cheats_commit_to_what_they_did(tmp_path: Path, monkeypatch) -> None:
    """half_steps trains 4 of 8 steps and states the task's boundaries; scaled sends 2x its
    honest update with an honest chain, which no longer ends at the update."""
    from trainer.proof import check_binding
    from trainer.resume import PausedState

    honest = _folder(tmp_path / "honest", digits_task("t-c", steps=8))
    assert task_runner.run(honest) == task_runner.EXIT_OK
    monkeypatch.setenv(task_runner.BYZANTINE_ENV, "half_steps")
    lazy = _folder(tmp_path / "lazy", digits_task("t-c", steps=8))
    assert task_runner.run(lazy) == task_runner.EXIT_OK
    assert json.loads(_meta(lazy)["boundaries"]) == [0, 2, 4, 6, 8]
    assert _result(lazy)["metrics"]["steps"] == 8  # it claims the task's steps
    half = PausedState.from_bytes((lazy / task_runner.CHECKPOINT.format(8)).read_bytes())
    full = PausedState.from_bytes((honest / task_runner.CHECKPOINT.format(8)).read_bytes())
    assert not torch.equal(half.tensors["loss_total"], full.tensors["loss_total"])

    monkeypatch.setenv(task_runner.BYZANTINE_ENV, "scaled:2")
    scaled = _folder(tmp_path / "scaled", digits_task("t-c", steps=8))
    assert task_runner.run(scaled) == task_runner.EXIT_OK
    for name, v in _delta(scaled).items():
        torch.testing.assert_close(v, 2.0 * _delta(honest)[name])
    last = PausedState.from_bytes((scaled / task_runner.CHECKPOINT.format(8)).read_bytes())
    model = decode_state((scaled / "model.safetensors").read_bytes())[0]
    assert "uploaded update" in check_binding(None, last, model, _delta(scaled))


def test_no_proof_where_the_update_is_not_the_chains_end(tmp_path: Path) -> None:
    """Top-k adds the residual in and a private update is clipped: the chain could not be
    bound to it, so the task carries no proof and is left to replicas."""
    t = digits_task("t-k", steps=4)
    t.task["codec"] = "topk"
    folder = _folder(tmp_path / "topk", t)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    assert "commitments" not in _meta(folder) and "proof" not in _result(folder)
    t = digits_task("t-d", steps=4)
    t.task["spec"]["privacy"] = {"clip_norm": 1.0, "noise_multiplier": 0.0}
    folder = _folder(tmp_path / "private", t)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    assert "commitments" not in _meta(folder)
