"""desktop.task_runner's overlap modes, in-process: the continuation that trains on while an
update uploads, and the task that starts from the global model plus that progress."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_marketplace import FakeTask, digits_task

from desktop import task_runner
from trainer.datasets import load_dataset
from trainer.local import train_local
from trainer.models import build_model
from trainer.spec import parse_spec
from trainer.updates import decode_state, encode_state


def _folder(path: Path, t: FakeTask, overlap: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "task.json").write_text(json.dumps(t.task | {"overlap": overlap}))
    (path / "model.safetensors").write_bytes(t.model)
    (path / "shard.safetensors").write_bytes(t.shard)
    return path


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return decode_state(path.read_bytes())[0]


def _train(t: FakeTask, start: dict[str, torch.Tensor], seed: int, steps: int) -> Any:
    """train_local as the runner calls it, on the task's shard, from `start`."""
    spec = parse_spec(t.task["spec"])
    shard = decode_state(t.shard)[0]
    data = dataclasses.replace(load_dataset(spec.dataset), x_train=shard["x"], y_train=shard["y"])
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed)
    result = train_local(model, start, data, spec, seed=seed, steps=steps,
                         batch_size=t.task["batch_size"])  # fmt: skip
    return result, model


def _same(a: Path, b: Path) -> bool:
    x, y = _tensors(a), _tensors(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _stop_after(monkeypatch: pytest.MonkeyPatch, forwards: int) -> None:
    """Puts the stop file in the runner's folder after `forwards` training forwards, as the
    agent would while the continuation runs (a hook after the runner's own)."""
    real = train_local

    def wrapped(model: Any, *args: Any, **kw: Any) -> Any:
        seen = [0]

        def after(module: Any, inputs: Any, out: Any) -> None:
            seen[0] += 1
            if seen[0] == forwards:
                Path(task_runner.STOP).touch()

        model.register_forward_hook(after)
        return real(model, *args, **kw)

    monkeypatch.setattr("trainer.local.train_local", wrapped)


def test_an_overlap_task_leaves_its_local_weights(tmp_path: Path) -> None:
    t = digits_task("t-o1", steps=3)
    folder = _folder(tmp_path / "o", t)
    assert task_runner.run(folder) == task_runner.EXIT_OK
    update, local = _tensors(folder / "update.safetensors"), _tensors(folder / task_runner.LOCAL)
    for k, v in t.reference.items():
        torch.testing.assert_close(local[k], v + update[k], rtol=0, atol=0)
    plain = _folder(tmp_path / "plain", t, overlap=False)
    assert task_runner.run(plain) == task_runner.EXIT_OK
    assert not (plain / task_runner.LOCAL).exists()
    # without progress, an overlap task sends what any task sends
    assert _same(plain / "update.safetensors", folder / "update.safetensors")


def test_a_continuation_stops_on_the_stop_file_and_keeps_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = digits_task("t-o2", steps=20)
    sent = _folder(tmp_path / "sent", t)
    assert task_runner.run(sent) == task_runner.EXIT_OK
    at_send = _tensors(sent / task_runner.LOCAL)

    cont = tmp_path / "cont"
    cont.mkdir()
    for name in ("task.json", "shard.safetensors", task_runner.LOCAL):
        (cont / name).write_bytes((sent / name).read_bytes())
    (cont / task_runner.CONTINUE).write_text("{}")
    monkeypatch.chdir(cont)  # the stop file lands in the folder, as the agent puts it
    _stop_after(monkeypatch, forwards=3)
    assert task_runner.run(cont) == task_runner.EXIT_OK
    result = json.loads((cont / "result.json").read_text())
    assert result["status"] == "ok" and result["stopped"] is True
    assert result["metrics"]["steps"] == 3  # stopped before step 4, the 3 done are kept
    progress = _tensors(cont / task_runner.PROGRESS)

    _, model = _train(t, at_send, seed=t.task["seed"] + 1, steps=3)
    now = model.state_dict()
    assert progress.keys() == at_send.keys()
    for k in at_send:
        torch.testing.assert_close(progress[k], now[k] - at_send[k])
    assert any(v.abs().sum() > 0 for v in progress.values())


def test_a_continuation_without_a_stop_trains_the_task_steps(tmp_path: Path) -> None:
    t = digits_task("t-o3", steps=4)
    cont = tmp_path / "cont"
    cont.mkdir()
    (cont / "task.json").write_text(json.dumps(t.task | {"overlap": True}))
    (cont / "shard.safetensors").write_bytes(t.shard)
    (cont / task_runner.LOCAL).write_bytes(t.model)
    (cont / task_runner.CONTINUE).write_text("{}")
    assert task_runner.run(cont) == task_runner.EXIT_OK
    result = json.loads((cont / "result.json").read_text())
    assert result["stopped"] is False and result["metrics"]["steps"] == 4


def _progress(t: FakeTask, scale: float = 0.01) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {k: scale * torch.randn(v.shape, generator=gen) for k, v in t.reference.items()}


def test_a_task_given_progress_starts_from_the_global_model_plus_progress(
    tmp_path: Path,
) -> None:
    t = digits_task("t-o4", steps=5)
    progress = _progress(t)
    folder = _folder(tmp_path / "merged", t)
    (folder / task_runner.PROGRESS).write_bytes(encode_state(progress))
    assert task_runner.run(folder) == task_runner.EXIT_OK
    assert json.loads((folder / "result.json").read_text())["merged"] is True
    update = _tensors(folder / "update.safetensors")

    merged = {k: t.reference[k] + progress[k] for k in t.reference}
    expected, _ = _train(t, merged, seed=t.task["seed"], steps=5)
    for k in t.reference:  # local final − global model = progress + what this task trained
        torch.testing.assert_close(update[k], expected.delta[k] + progress[k])
    local = _tensors(folder / task_runner.LOCAL)
    for k in t.reference:
        torch.testing.assert_close(local[k], merged[k] + expected.delta[k])

    # a task not marked overlap never merges, whatever lies in its folder
    plain = _folder(tmp_path / "plain", t, overlap=False)
    (plain / task_runner.PROGRESS).write_bytes(encode_state(progress))
    assert task_runner.run(plain) == task_runner.EXIT_OK
    fresh, _ = _train(t, t.reference, seed=t.task["seed"], steps=5)
    for k, v in _tensors(plain / "update.safetensors").items():
        torch.testing.assert_close(v, fresh.delta[k])


def test_progress_that_fails_an_updates_checks_is_dropped(tmp_path: Path) -> None:
    t = digits_task("t-o5", steps=3)
    plain = _folder(tmp_path / "plain", t)
    assert task_runner.run(plain) == task_runner.EXIT_OK
    bad = _progress(t)
    bad[next(iter(bad))] = torch.full((3,), float("nan"))  # the wrong shape, and not finite
    folder = _folder(tmp_path / "bad", t)
    (folder / task_runner.PROGRESS).write_bytes(encode_state(bad))
    assert task_runner.run(folder) == task_runner.EXIT_OK
    assert json.loads((folder / "result.json").read_text())["merged"] is False
    assert _same(folder / "update.safetensors", plain / "update.safetensors")


class _Clock:
    """time for the runner's hooks: it moves only when a step computes or the hook sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return self.now


def test_a_paced_continuation_steps_as_a_slower_gpu_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `pace` 3 (the agent's compute_scale) each step is held back to 3x the time it
    took, so a continuation stopped by its upload's end has done a third of the steps; a
    stop file ends the wait at once."""
    clock = _Clock()
    monkeypatch.setattr(task_runner, "time", clock)
    model = torch.nn.Linear(2, 2)
    stop = tmp_path / task_runner.STOP
    task_runner._watch_steps(model, steps=10, accum=1, stop=(stop,), pace=3.0)
    x = torch.zeros(1, 2)
    starts = []
    for _ in range(3):
        model(x)
        starts.append(clock.now)
        clock.now += 1.0  # the step's compute
    assert starts == [0.0, 3.0, 6.0]  # each 1 s step takes 3 s
    stop.touch()
    with pytest.raises(task_runner._StopRequested):
        model(x)
    assert clock.now == 7.0  # no wait once it is asked to stop (it would have been 9)


def test_an_emulated_gpus_steps_take_at_least_their_fixed_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`min_step_s` 2 (a bench's emulated GPU, desktop.emulated_gpu): a step that computed
    for 0.5 s is held to 2 s, one that took 3 s (a loaded host) is not held at all."""
    clock = _Clock()
    monkeypatch.setattr(task_runner, "time", clock)
    model = torch.nn.Linear(2, 2)
    seen = task_runner._watch_steps(model, steps=10, accum=1, min_step_s=2.0)
    x = torch.zeros(1, 2)
    starts = []
    for compute in (0.5, 3.0, 0.5):
        model(x)
        starts.append(clock.now)
        clock.now += compute
    model(x)
    starts.append(clock.now)
    assert starts == [0.0, 2.0, 5.0, 7.0]
    assert seen["held_s"] == 1.5 + 1.5


@pytest.mark.parametrize(
    ("marker", "pace"),
    [({"pace": 4}, (4.0, 0.0)), ({}, (1.0, 0.0)), ({"pace": "nan"}, (1.0, 0.0)),
     ({"pace": 0.5}, (1.0, 0.0)), ([], (1.0, 0.0)), ({"pace": 1, "step_s": 0.2}, (1.0, 0.2)),
     ({"step_s": -1}, (1.0, 0.0)), ({"step_s": "inf"}, (1.0, 0.0))],
)  # fmt: skip
def test_the_continuation_reads_its_pace(
    tmp_path: Path, marker: object, pace: tuple[float, float]
) -> None:
    (tmp_path / task_runner.CONTINUE).write_text(json.dumps(marker))
    assert task_runner._pace(tmp_path) == pace


def test_the_owners_gpu_use_cap_holds_steps_back_and_is_not_billed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_gpu_busy_pct 25 (GPUFLEX_DUTY_CYCLE 0.25): each step is followed by three times
    its time held back, counted in `held_s`, which the runner takes off the compute billed."""
    monkeypatch.setenv(task_runner.DUTY_ENV, "0.25")
    assert task_runner._duty_pace() == 4.0
    clock = _Clock()
    monkeypatch.setattr(task_runner, "time", clock)
    model = torch.nn.Linear(2, 2)
    seen = task_runner._watch_steps(model, steps=10, accum=1, pace=task_runner._duty_pace())
    for _ in range(3):
        model(torch.zeros(1, 2))
        clock.now += 0.5  # the step's compute
    model(torch.zeros(1, 2))  # the fourth step starts after the third's hold
    assert seen["held_s"] == 3 * 1.5  # three steps of 0.5 s, each held back 1.5 s


@pytest.mark.parametrize(("value", "pace"), [("1", 1.0), ("0.5", 2.0), ("", 1.0), ("x", 1.0),
                                             ("0", 1.0), ("0.01", 1.0), ("nan", 1.0)])  # fmt: skip
def test_a_missing_or_senseless_gpu_use_cap_means_no_cap(
    monkeypatch: pytest.MonkeyPatch, value: str, pace: float
) -> None:
    monkeypatch.setenv(task_runner.DUTY_ENV, value)
    assert task_runner._duty_pace() == pace
