"""The program that runs INSIDE the sandbox: one task, from files in its folder to files back.

Reads task.json, the round's model and shard.safetensors from the task folder, trains with
trainer.local.train_local and writes update.safetensors and result.json. The model comes as
model.safetensors, or as model.base.safetensors plus model.delta.N.safetensors to apply in
order, or not at all when the task's model_source says to build it from the seed; built or
rebuilt, it is checked against the task's model hash and written out as model.safetensors
for the agent's input cache. A federated task (`local_dataset` in task.json) has no shard: it
reads the owner's local dataset where local_data.json says the agent bound it, read-only.
Nothing else: no
network (there is none in the sandbox), no pickle, no user code; the model is built from the
spec alone. Progress goes to stdout as JSON lines for the agent to relay.

Overlap (a task with `overlap: true`, docs/agent-api.md): the runner also writes the final
local weights as local.safetensors, and a task folder the agent put progress.safetensors in
starts from the global model + that progress (the merge) instead of the global model; its
update is still local final − global model. A folder with continue.json (the agent's request)
is a continuation instead: it trains on from local.safetensors on the task's shard until a
file named `stop` appears in the folder (checked before every step, so the steps done are
kept) or it has trained the task's steps, then writes progress.safetensors = local now −
local at send, checked like an update, and result.json with the steps it did.

Pausing (desktop/README.md, "When it works, and how it pauses"): a file named `pause` in the
folder stops training before the next step; the runner writes the run's state to
paused.safetensors (trainer.resume) and result.json with status "paused", and exits 5.
Started again in a folder that holds paused.safetensors for the same task, it resumes from
there and makes the update an unpaused run would have made.

Exit codes: 0 ok, 3 out of memory, 4 bad input, 5 paused, 1 anything else.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_CRASHED = 1
EXIT_OOM = 3
EXIT_BAD_INPUT = 4
EXIT_PAUSED = 5


# overlap (see the module docstring): the files the agent and the runner exchange
LOCAL = "local.safetensors"
PROGRESS = "progress.safetensors"
CONTINUE = "continue.json"
STOP = "stop"
# pausing (see the module docstring): the agent's request, and the state the runner leaves
PAUSE = "pause"
PAUSED = "paused.safetensors"

# a federated task's local dataset: where the agent bound it in the sandbox, and how to read it
LOCAL_DATA = "local_data.json"
# an exported model's program (model.arch: exported), read here through trainer.exported
PROGRAM = "program.pt2"

# result.json's reason when a download does not match the task's hash: the agent fetches it again
CORRUPT_INPUT = "corrupt_input"

# Fault injection for robustness tests (`python -m desktop.fault_injection --byzantine`, no
# option of `gpuflex-node run`): the agent sets this variable on the sandbox, never the
# marketplace (task.json comes from the server, and a server
# must not be able to turn honest nodes into attackers). "MODE:SCALE"; each mode's default
# scale is harmful enough that with one attacker in five plain FedAvg ends far below a clean
# run (tests/system/test_fault_byzantine.py).
BYZANTINE_ENV = "GPUFLEX_BYZANTINE"
BYZANTINE_SCALES = {"sign_flip": 10.0, "noise": 30.0, "scaled": 2.0, "half_steps": 0.5,
                    "wrong_shard": 1.0, "precision_claim": 1.0, "copy": 1.0,
                    "stale": 1.0}  # fmt: skip
# the lazy cheats (issue 35) a proof of learning's segment check is for: they change how the
# node trains, not only what it sends (see `run`)
LAZY = ("half_steps", "wrong_shard", "precision_claim")
# copy and stale send an update made earlier (the agent's fault injection puts it in the folder
# under this name: another shard's, or this shard's from an earlier round) and train nothing;
# their chain is made up: the round's model, then straight on to the copied update
COPIERS = ("copy", "stale")
CHEAT_SOURCE = "cheat_source.safetensors"

# proof of learning (trainer.proof): the state at each of the task's step boundaries, kept in
# the folder as CHECKPOINT.format(step) for the agent to keep and reveal on the server's
# request; the upload's metadata carries their commitments and the boundaries as JSON lists
CHECKPOINT = "checkpoint.{}.safetensors"


class BadInput(ValueError):
    pass


class CorruptInput(ValueError):
    pass


def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    _write_bytes(path, json.dumps(data).encode("utf-8"))


def _num_classes(spec: Any, input_shape: tuple[int, ...], state: dict[str, Any]) -> int:
    """The class count is not in the task; read it off the global model: build the model for
    two class counts on the meta device (no memory) and find the tensor whose shape moves."""
    import torch

    from trainer.models import build_model

    if spec.model.arch == "exported":  # the program has its own head: no count to build it
        return 0
    with torch.device("meta"):
        a = build_model(spec.model, input_shape, 2).state_dict()
        b = build_model(spec.model, input_shape, 3).state_dict()
    if a.keys() != state.keys():
        raise BadInput("the global model's tensors do not match the job spec's model")
    for name in a:
        if a[name].shape != b[name].shape:
            for dim, (x, y) in enumerate(zip(a[name].shape, b[name].shape, strict=True)):
                if (x, y) == (2, 3):
                    return int(state[name].shape[dim])
    raise BadInput("cannot tell the number of classes from the global model")


def _residual(path: Path) -> Any:
    """The job's error-feedback residual from earlier tasks, if the agent passed one in."""
    from trainer.updates import decode_state

    if not path.exists():
        return None
    return decode_state(path.read_bytes())[0].get("residual")


def _read_checked(path: Path, expected: Any, keys: tuple[str, ...] | None = None) -> Any:
    """The tensors in `path`, checked against the task's content hash of those `keys` (all
    when None); a task without a hash is still decoded safely."""
    from trainer.hashing import state_hash
    from trainer.updates import decode_state

    state, _ = decode_state(path.read_bytes())
    if keys is not None and not all(k in state for k in keys):
        raise CorruptInput(f"{path.name} lacks the tensors {', '.join(keys)}")
    hashed = state if keys is None else {k: state[k] for k in keys}
    if isinstance(expected, str) and len(expected) == 64 and state_hash(hashed) != expected:
        raise CorruptInput(f"{path.name} does not match the task's content hash")
    return state


def _global_model(folder: Path, task: dict[str, Any], spec: Any) -> Any:
    """The round's model, however it came (see the module docstring), checked by hash."""
    from trainer.delivery import apply_delta
    from trainer.hashing import state_hash
    from trainer.models import build_model
    from trainer.updates import UpdateRejected, encode_state

    whole = folder / "model.safetensors"
    expected = task.get("model_hash")
    if whole.exists():
        return _read_checked(whole, expected)
    source = task.get("model_source") or {}
    base = folder / "model.base.safetensors"
    if base.exists():
        state = _read_checked(base, source.get("base"))
        deltas = sorted(folder.glob("model.delta.*.safetensors"),
                        key=lambda p: int(p.name.split(".")[2]))  # fmt: skip
        try:
            for delta in deltas:
                state = apply_delta(state, delta.read_bytes())
        except UpdateRejected as exc:
            raise CorruptInput(f"{delta.name}: {exc}") from None
        what = f"the model rebuilt from {len(deltas)} delta(s)"
    elif source.get("kind") == "seed":
        shape = tuple(int(d) for d in source.get("input_shape") or ())
        model = build_model(spec.model, shape, int(source.get("num_classes") or 0), seed=spec.seed)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        what = "the model built from the job's seed"
    else:
        raise CorruptInput("the task folder holds no model")
    if isinstance(expected, str) and state_hash(state) != expected:
        raise CorruptInput(f"{what} does not match the task's model hash")
    whole.write_bytes(encode_state(state))
    return state


def _byzantine(value: str) -> tuple[str, float] | None:
    """The attack `BYZANTINE_ENV` asks for, or None for an honest node."""
    if not value:
        return None
    mode, _, scale = value.partition(":")
    if mode not in BYZANTINE_SCALES:
        raise ValueError(f"{BYZANTINE_ENV}: unknown attack {mode!r}")
    return mode, float(scale) if scale else BYZANTINE_SCALES[mode]


def attack(delta: dict[str, Any], mode: str, scale: float, seed: int) -> dict[str, Any]:
    """A Byzantine node's update from its honest `delta`: `sign_flip` sends -scale x delta;
    `scaled` sends scale x delta (its checkpoints stay honest); `noise` adds Gaussian noise
    with, in each tensor, scale x that tensor's RMS as its std (so
    about scale x the update's norm). Seeded by the task, so a task always sends the same bytes."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(delta):  # fixed for the generator: decode_state's key order varies
        v = delta[name]
        if v.is_floating_point():
            if mode == "sign_flip":
                v = v * -scale
            elif mode == "scaled":
                v = v * scale
            elif mode == "noise":
                std = scale * float(v.double().square().mean().sqrt())
                v = v + (torch.randn(v.shape, generator=gen, dtype=torch.float64) * std).to(v)
        out[name] = v
    return out


class _StopRequested(Exception):
    """Raised before a step of a continuation once the agent has asked it to stop."""


def _device() -> Any:
    """The device to train on, with the GPU memory cap the agent asked for."""
    import torch

    from trainer.device import best_device

    device = best_device(os.environ.get("GPUFLEX_DEVICE") or None)  # "cuda:N", never bare
    if device.type == "cuda":
        fraction = float(os.environ.get("GPUFLEX_GPU_MEMORY_FRACTION", "0.9"))
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return device


def _dataset(shard: dict[str, Any], spec: Any, state: dict[str, Any]) -> Any:
    """The shard as a training set; the class count read off `state` (raises BadInput)."""
    import torch

    from trainer.datasets import Dataset

    x, y = shard["x"], shard["y"]
    lm = x.dtype == torch.int64 and y.dim() == 2
    input_shape = tuple(int(d) for d in x.shape[1:])
    num_classes = 256 if lm else _num_classes(spec, input_shape, state)
    return Dataset(
        name="shard", task="language_model" if lm else "classification",
        x_train=x, y_train=y, x_test=x[:0], y_test=y[:0], num_classes=num_classes,
        input_shape=input_shape, lengths_train=shard.get("lengths"),
    )  # fmt: skip


def _local_dataset(folder: Path, spec: Any, state: dict[str, Any]) -> Any:
    """A federated task's training set: the owner's local dataset, read where the agent
    bound it (LOCAL_DATA says where and how), split as the job's spec splits; checked to fit
    the round's model (raises BadInput naming the mismatch)."""
    from trainer.datasets import DatasetError, load_dataset
    from trainer.spec import DatasetSpec

    try:
        where = json.loads((folder / LOCAL_DATA).read_text(encoding="utf-8"))
        local = DatasetSpec(
            kind=where["kind"], path=where["path"], label_column=where["label_column"],
            image_size=where["image_size"], test_fraction=spec.dataset.test_fraction,
        )  # fmt: skip
        data = load_dataset(local, seed=spec.seed)
    except (OSError, KeyError, ValueError, DatasetError) as exc:
        raise BadInput(f"the local dataset cannot be read: {exc}") from None
    try:
        classes = _num_classes(spec, data.input_shape, state)
    except (BadInput, RuntimeError, ValueError):
        classes = None
    if classes != data.num_classes:
        raise BadInput(
            f"the local dataset {where.get('name')!r} (rows of shape {list(data.input_shape)}, "
            f"{data.num_classes} classes) does not fit the job's model"
        )
    return data


def _watch_steps(
    model: Any,
    steps: int,
    accum: int,
    stop: tuple[Path, ...] = (),
    pace: float = 1.0,
    min_step_s: float = 0.0,
) -> dict[str, Any]:
    """Hooks on `model`: progress events for the agent's progress bar (train_local has no
    callback; one forward per micro-batch, `accum` of them make a step), and with `stop`, a
    graceful stop before the step that would start once one of those files exists. `pace` > 1 holds
    each step back to `pace` x the time it took, as a GPU that many times slower would (the
    agent's `compute_scale`, a bench device, or the owner's GPU use cap); `min_step_s` > 0
    holds each step back to at least that long (a bench's emulated GPU of a fixed speed,
    desktop.emulated_gpu). Returns the count
    of training forwards, `n`, and the seconds held back, `held_s`."""
    total = steps * accum
    seen = {"n": 0, "t": 0.0, "step": time.monotonic(), "held_s": 0.0}

    def on_forward(module: Any, args: Any, out: Any) -> None:
        if module.training:
            seen["n"] += 1
            now = time.monotonic()
            if now - seen["t"] > 0.25 or seen["n"] == total:
                seen["t"] = now
                _emit(progress=min(1.0, seen["n"] / total), step=seen["n"] // accum)

    def before_forward(module: Any, args: Any) -> None:
        # only between steps: the weights then hold exactly the steps done
        if not module.training or seen["n"] % accum:
            return
        if (pace > 1.0 or min_step_s > 0) and seen["n"]:
            held = time.monotonic()
            took = held - seen["step"]
            until = held + max((pace - 1.0) * took, min_step_s - took)
            while time.monotonic() < until and not any(p.exists() for p in stop):
                time.sleep(min(0.02, max(0.0, until - time.monotonic())))
            seen["held_s"] += time.monotonic() - held
        if any(p.exists() for p in stop):
            raise _StopRequested
        seen["step"] = time.monotonic()

    model.register_forward_hook(on_forward)
    if stop or pace > 1.0 or min_step_s > 0:
        model.register_forward_pre_hook(before_forward)
    return seen


def _added(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    # `b` may cover part of `a`: a LoRA model's updates carry its adapters alone
    return {k: a[k] + b[k] if k in b else a[k] for k in a}


def _progress(path: Path, global_state: dict[str, Any], max_norm: float | None) -> Any:
    """The progress a continuation made since the last send, to merge into this task's start;
    None when there is none, or when it does not pass an update's checks (it is the node's
    own history, best effort: such progress is dropped, and the task starts from the model)."""
    from trainer.compression import decode_any
    from trainer.updates import UpdateRejected

    if not path.exists():
        return None
    try:
        return decode_any(path.read_bytes(), global_state, max_norm)[0]
    except (OSError, ValueError, UpdateRejected) as exc:
        _emit(note=f"progress dropped: {exc}")
        return None


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _kind(folder: Path) -> str:
    try:
        task = json.loads((folder / "task.json").read_text(encoding="utf-8"))
        return str(task.get("kind", "train")) if isinstance(task, dict) else "train"
    except (OSError, ValueError):
        return "train"  # run() reports the unreadable task


def _with_program(folder: Path, spec: Any) -> Any:
    """An exported model's spec with its program the task folder's copy: the buyer's file
    name in the spec means nothing here."""
    if spec.model.arch != "exported":
        return spec
    return spec.replace(
        model=spec.model.model_dump(mode="json") | {"program": str(folder / PROGRAM)}
    )


def run(folder: Path) -> int:
    if (folder / CONTINUE).exists():
        return run_continuation(folder)
    if _kind(folder) in ("evaluate", "inference"):
        return run_scoring(folder)
    _emit(phase="started", t=time.time())  # the bench splits sandbox start from imports
    import torch

    from trainer.compression import CodecConfig, ErrorFeedback, decode_any, encode_update
    from trainer.local import LocalResult, planned_steps, resolve_precision, train_local
    from trainer.lora import update_part
    from trainer.models import ModelSpecError, build_model
    from trainer.proof import boundaries
    from trainer.proof_commitment import provable
    from trainer.resume import ResumeError, TrainingPaused
    from trainer.spec import SpecError, parse_spec
    from trainer.updates import UpdateRejected, encode_state

    try:
        task = json.loads((folder / "task.json").read_text(encoding="utf-8"))
        spec = _with_program(folder, parse_spec(task["spec"], "task spec"))
        codec = CodecConfig(
            task.get("codec", "none"), spec.compression.block_size, spec.compression.topk_fraction
        )
        feedback = ErrorFeedback(_residual(folder / "residual.safetensors"))
        lr = _task_lr(task)
        byzantine = _byzantine(os.environ.get(BYZANTINE_ENV, ""))
    except (OSError, KeyError, ValueError, SpecError, UpdateRejected) as exc:
        _write_json(folder / "result.json", {"status": "failed", "reason": "crashed",
                                             "detail": f"bad task input: {exc}"})  # fmt: skip
        return EXIT_BAD_INPUT
    try:
        # the downloads are checked here, in the sandbox, and not by the agent: untrusted bytes
        # are parsed only where they can do no harm, and the agent never needs torch
        global_state = _global_model(folder, task, spec)
        local = bool(task.get("local_dataset"))  # federated: the node's own data, no shard
        shard = None if local else _read_checked(
            folder / "shard.safetensors", task.get("shard_hash"), ("x", "y")
        )  # fmt: skip
    except (OSError, UpdateRejected, CorruptInput, ModelSpecError) as exc:
        _write_json(folder / "result.json", {"status": "failed", "reason": CORRUPT_INPUT,
                                             "detail": str(exc)})  # fmt: skip
        return EXIT_BAD_INPUT
    _emit(phase="imported", t=time.time())  # and inputs read

    device = _device()
    try:
        data = (
            _local_dataset(folder, spec, global_state) if shard is None
            else _dataset(shard, spec, global_state)
        )  # fmt: skip
    except BadInput as exc:
        _write_json(folder / "result.json",
                    {"status": "failed", "reason": "crashed", "detail": str(exc)})  # fmt: skip
        return EXIT_BAD_INPUT
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed).to(device)
    steps = int(task.get("steps") or 0) or None
    task_steps = steps or planned_steps(spec, data.num_train, task.get("batch_size"))
    claimed = boundaries(task_steps)  # the boundaries the proof commits to
    trained_steps, trained_bounds = task_steps, claimed
    mode = byzantine[0] if byzantine else ""
    if mode == "half_steps":  # trains a fraction of the steps, states the task's boundaries
        trained_steps = max(1, round(task_steps * byzantine[1]))  # type: ignore[index]
        trained_bounds = boundaries(trained_steps, len(claimed) - 1)
        steps = trained_steps
    elif mode == "wrong_shard":  # other rows than the task's: its shard's second half
        data = data.subset(torch.arange(data.num_train // 2, data.num_train))
    elif mode == "precision_claim" and spec.local.precision != "fp16":
        try:  # trains in fp16 where this device can, and claims below that it ran fp32
            resolve_precision("fp16", device)
            spec = spec.replace(local=spec.local.model_dump(mode="json") | {"precision": "fp16"})
        except ValueError:
            pass
    renamed = dict(zip(trained_bounds, claimed, strict=False))

    def keep_checkpoint(state: Any) -> None:
        state.step = renamed.get(state.step, state.step)
        _write_bytes(folder / CHECKPOINT.format(state.step), state.to_bytes())

    seen = _watch_steps(model, steps or 1, spec.local.grad_accum_steps, pace=_duty_pace())
    _emit(progress=0.0, step=0, device=str(device))
    overlap = bool(task.get("overlap"))
    max_norm = spec.aggregation.max_update_norm
    reference = update_part(spec.model, global_state)  # what an update carries
    progress = _progress(folder / PROGRESS, reference, max_norm) if overlap else None
    start = global_state if progress is None else _added(global_state, progress)  # the merge
    identity = {"task_id": str(task.get("id", "")), "model_hash": task.get("model_hash"),
                "merged": progress is not None}  # fmt: skip

    def train(resume: Any) -> Any:
        return train_local(
            model, start, data, spec, seed=int(task.get("seed", 0)), steps=steps,
            batch_size=task.get("batch_size"), proximal_mu=float(task.get("proximal_mu", 0.0)),
            lr=lr, pause=(folder / PAUSE).exists, resume=resume, checkpoints=trained_bounds,
            on_checkpoint=keep_checkpoint if len(trained_bounds) == len(claimed) else None,
        )  # fmt: skip

    source = folder / CHEAT_SOURCE
    copied = None
    if mode in COPIERS and source.exists():  # nothing to copy yet: it trains, this once
        with contextlib.suppress(ValueError, OSError):  # another model's update: trains too
            copied = _copied(source, reference, max_norm)
    if copied is not None:
        _fabricate_chain(folder, model, start, data, spec, task, lr, claimed, copied)
    faked = None
    if copied is not None:  # no training at all: what it sends is the copy
        faked = LocalResult(delta=copied, num_samples=data.num_train, steps=task_steps, loss=0.0,
                            compute_s=0.0, precision=resolve_precision(spec.local.precision,
                                                                       device))  # fmt: skip
    try:
        try:
            result = faked or train(_paused_state(folder, identity))
        except ResumeError as exc:  # the same task, but run otherwise (batch, precision...)
            _emit(note=f"paused state dropped: {exc}")
            result = train(None)
    except TrainingPaused as paused:
        paused.state.meta["task"] = identity
        _write_bytes(folder / PAUSED, paused.state.to_bytes())
        _write_json(folder / "result.json", {"status": "paused", "steps": paused.state.step})
        _emit(phase="paused", step=paused.state.step, t=time.time())
        return EXIT_PAUSED
    (folder / PAUSED).unlink(missing_ok=True)  # used up: the update below replaces it
    _emit(phase="trained", t=time.time())
    # the precision that ran travels with the update: verification compares replicas that
    # ran in different precisions (a CPU's fp32, a GPU's bf16) by a rule measured for that
    metadata = {"task_id": str(task.get("id", "")),
                "precision": "fp32" if mode == "precision_claim" else result.precision,
                "device": device.type}  # fmt: skip
    # a chain is bound to the update (trainer.proof.check_binding): none where the update is
    # not local final - global model (a clipped or noised private update, top-k's residual
    # added in, or a start merged with a continuation's progress). Those are left to replicas
    chained = provable(private=spec.privacy.clip_norm is not None, codec=codec.name,
                       merged=progress is not None)  # fmt: skip
    proof = _proof(folder, claimed) if chained else None
    if proof is not None:  # commitments to the states it passed (trainer.proof_commitment)
        metadata["commitments"] = json.dumps(proof["commitments"])
        metadata["boundaries"] = json.dumps(proof["boundaries"])
    # local final − global model: with a merge, the progress is part of what this node sends
    delta = result.delta if progress is None else _added(result.delta, progress)
    if byzantine is not None and mode not in LAZY:
        # corrupted before encoding: well formed, checked below and sent as an honest one is
        delta = attack(delta, *byzantine, seed=int(task.get("seed", 0)))
    update = encode_update(delta, codec, feedback, metadata)
    try:  # never hand over what the server would reject
        decode_any(update, reference, max_norm)
    except UpdateRejected as exc:
        _write_json(folder / "result.json", {"status": "failed", "reason": "crashed",
                    "detail": f"the task produced an unusable update: {exc}"})  # fmt: skip
        return EXIT_CRASHED
    if overlap:  # what a continuation trains on from while the update uploads
        _write_bytes(folder / LOCAL, encode_state(_added(start, result.delta)))
    _write_bytes(folder / "update.safetensors", update)
    if feedback.residual is not None:  # what top-k left out, carried to this job's next task
        residual = encode_state({"residual": feedback.residual})
        (folder / "residual.next.safetensors").write_bytes(residual)
    # the owner's GPU use cap holds steps back: time this node was not computing, not billed
    compute_s = max(result.compute_s - seen["held_s"], 0.0)
    outcome = {
        "status": "ok",
        "metrics": {"loss": result.loss,  # half_steps claims the task's steps, as a cheat would
                    "steps": task_steps if mode == "half_steps" else result.steps,
                    "samples": result.num_samples, "compute_s": compute_s},
        "device": str(device),
        "precision": result.precision,
    }  # fmt: skip
    if proof is not None:
        outcome["proof"] = proof
    if overlap:
        outcome["merged"] = progress is not None
    _write_json(folder / "result.json", outcome)
    _emit(progress=1.0, step=result.steps, phase="encoded", t=time.time())
    return EXIT_OK


def _copied(path: Path, reference: dict[str, Any], max_norm: float | None) -> Any:
    """The update a copy or stale cheat sends (fault injection): one made earlier."""
    from trainer.compression import decode_any

    return decode_any(path.read_bytes(), reference, max_norm)[0]


def _fabricate_chain(
    folder: Path, model: Any, start: dict[str, Any], data: Any, spec: Any,
    task: dict[str, Any], lr: Any, claimed: list[int], copied: dict[str, Any],
) -> None:  # fmt: skip
    """A copier's made-up checkpoints: the true state at step 0 (the round's model), then
    states on the straight line to the model plus the copied update, at each boundary."""
    from trainer.local import train_local
    from trainer.resume import PausedState

    first: list[Any] = []

    class _Got(Exception):
        pass

    def got(state: Any) -> None:
        first.append(state)
        raise _Got

    with contextlib.suppress(_Got):  # stopped before its first step
        train_local(model, start, data, spec, seed=int(task.get("seed", 0)),
                    steps=claimed[-1], batch_size=task.get("batch_size"),
                    proximal_mu=float(task.get("proximal_mu", 0.0)), lr=lr, checkpoints=(0,),
                    on_checkpoint=got)  # fmt: skip
    zero = first[0]
    for b in claimed:
        t = b / claimed[-1]
        tensors = dict(zero.tensors)
        for name, v in copied.items():
            key = "model/" + name
            tensors[key] = (start[name] + t * v).to(zero.tensors[key].dtype).contiguous()
        state = PausedState(b, tensors, zero.meta)
        _write_bytes(folder / CHECKPOINT.format(b), state.to_bytes())


def _proof(folder: Path, claimed: list[int]) -> dict[str, Any] | None:
    """The commitments to the checkpoints the run left at `claimed` boundaries (a resumed run
    left the earlier ones before its pause); None when one is missing: a task without a
    proof is still a task, verified by replicas alone."""
    from trainer.proof_commitment import CommitmentError, commitment

    try:
        hashes = [commitment((folder / CHECKPOINT.format(b)).read_bytes()) for b in claimed]
    except (OSError, CommitmentError) as exc:
        _emit(note=f"no proof of learning: {exc}")
        return None
    return {"commitments": hashes, "boundaries": claimed}


def _paused_state(folder: Path, identity: dict[str, Any]) -> Any:
    """The state an earlier attempt at this same task paused with, if any. A damaged one, or
    one left by another task, is dropped with a note: the task then trains from the start."""
    from trainer.resume import PausedState, ResumeError

    path = folder / PAUSED
    if not path.exists():
        return None
    try:
        state = PausedState.from_bytes(path.read_bytes())
        if state.meta.get("task") != identity:
            raise ResumeError("it was left by another task or model")
    except (OSError, ResumeError) as exc:
        _emit(note=f"paused state dropped: {exc}")
        path.unlink(missing_ok=True)
        return None
    _emit(note=f"resuming after {state.step} steps", step=state.step)
    return state


# the agent's cap on how busy a task keeps the GPU, a fraction in (0, 1] (Settings'
# max_gpu_busy_pct): steps are held back so the GPU computes at most that share of the time
DUTY_ENV = "GPUFLEX_DUTY_CYCLE"


def _duty_pace() -> float:
    """The pace (see _watch_steps) that keeps the GPU busy for at most the agent's share."""
    try:
        duty = float(os.environ.get(DUTY_ENV, "1"))
    except ValueError:
        return 1.0
    return 1.0 / duty if math.isfinite(duty) and 0.05 <= duty < 1.0 else 1.0


def _pace(folder: Path) -> tuple[float, float]:
    """The continuation's `pace` and `step_s` (continue.json): how many times slower than
    this machine the agent simulates its GPU, and the least time a step takes on a bench's
    emulated GPU (desktop.emulated_gpu; 0: none). The agent slows its tasks itself, after
    they ran; a continuation is stopped by time (its upload's end), so its steps must be
    slowed as they happen."""
    try:
        marker = json.loads((folder / CONTINUE).read_text(encoding="utf-8"))
        pace, step_s = float(marker.get("pace", 1)), float(marker.get("step_s", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 1.0, 0.0
    return (
        pace if math.isfinite(pace) and pace > 1.0 else 1.0,
        step_s if math.isfinite(step_s) and step_s > 0 else 0.0,
    )


def _task_lr(task: dict[str, Any]) -> float | None:
    """The round's learning rate the server sent (its optimizer.schedule); None from an older
    server, which means the spec's own `optimizer.lr`."""
    lr = task.get("lr")
    if lr is None:
        return None
    lr = float(lr)
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"the task's lr {lr!r} is not a positive number")
    return lr


def run_scoring(folder: Path) -> int:
    """An evaluate or inference task: score the round's model over the shard's rows
    (trainer.scoring) and write the sums, or the predictions, as update.safetensors."""
    _emit(phase="started", t=time.time())
    from trainer.models import ModelSpecError, build_model
    from trainer.scoring import predict, score
    from trainer.spec import SpecError, parse_spec
    from trainer.updates import UpdateRejected

    try:
        task = json.loads((folder / "task.json").read_text(encoding="utf-8"))
        spec = _with_program(folder, parse_spec(task["spec"], "task spec"))
    except (OSError, KeyError, ValueError, SpecError) as exc:
        _write_json(folder / "result.json", {"status": "failed", "reason": "crashed",
                                             "detail": f"bad task input: {exc}"})  # fmt: skip
        return EXIT_BAD_INPUT
    try:
        state = _global_model(folder, task, spec)
        shard = _read_checked(folder / "shard.safetensors", task.get("shard_hash"), ("x", "y"))
    except (OSError, UpdateRejected, CorruptInput, ModelSpecError) as exc:
        _write_json(folder / "result.json", {"status": "failed", "reason": CORRUPT_INPUT,
                                             "detail": str(exc)})  # fmt: skip
        return EXIT_BAD_INPUT
    _emit(phase="imported", t=time.time())
    device = _device()
    try:
        data = _dataset(shard, spec, state)
    except BadInput as exc:
        _write_json(folder / "result.json",
                    {"status": "failed", "reason": "crashed", "detail": str(exc)})  # fmt: skip
        return EXIT_BAD_INPUT
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed).to(device)
    model.load_state_dict(state)
    _emit(progress=0.0, step=0, device=str(device))
    started = time.perf_counter()
    meta = {"task_id": str(task.get("id", "")), "precision": "fp32", "device": device.type}
    if spec.kind == "evaluate":
        sums = score(model, data.x_train, data.y_train, data.task)
        payload, extra = sums.to_bytes(meta), {"loss": sums.loss_sum / max(sums.count, 1)}
    else:
        payload, extra = predict(model, data.x_train).to_bytes(meta), {}
    compute_s = time.perf_counter() - started
    _write_bytes(folder / "update.safetensors", payload)
    _write_json(folder / "result.json", {
        "status": "ok", "device": str(device), "precision": "fp32",
        "metrics": {"samples": data.num_train, "compute_s": compute_s, **extra},
    })  # fmt: skip
    _emit(progress=1.0, phase="encoded", t=time.time())
    return EXIT_OK


def run_continuation(folder: Path) -> int:
    """Train on from local.safetensors while the update uploads (see the module docstring)."""
    _emit(phase="started", t=time.time())
    from trainer.compression import CodecConfig, decode_any, encode_update
    from trainer.local import train_local
    from trainer.lora import update_keys
    from trainer.models import ModelSpecError, build_model
    from trainer.spec import SpecError, parse_spec
    from trainer.updates import UpdateRejected, decode_state

    try:
        task = json.loads((folder / "task.json").read_text(encoding="utf-8"))
        spec = _with_program(folder, parse_spec(task["spec"], "task spec"))
        local, _ = decode_state((folder / LOCAL).read_bytes())
        lr = _task_lr(task)
        shard = _read_checked(folder / "shard.safetensors", task.get("shard_hash"), ("x", "y"))
        data = _dataset(shard, spec, local)
    except (OSError, KeyError, ValueError, SpecError, UpdateRejected, ModelSpecError) as exc:
        detail = f"bad continuation input: {exc}"
        _write_json(folder / "result.json",
                    {"status": "failed", "reason": "crashed", "detail": detail})  # fmt: skip
        return EXIT_BAD_INPUT
    device = _device()
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed).to(device)
    cap = int(task.get("steps") or 0) or None
    accum = spec.local.grad_accum_steps
    pace, step_s = _pace(folder)
    # asked to pause (the agent stopping, desktop/README.md), it stops as it would at the
    # upload's end: its progress is kept
    seen = _watch_steps(model, cap or 1, accum, (folder / STOP, folder / PAUSE), pace, step_s)
    started = time.perf_counter()
    stopped = False
    try:
        # another seed than the task's: other batches than the ones the update was made of
        done = train_local(
            model, local, data, spec, seed=int(task.get("seed", 0)) + 1, steps=cap,
            batch_size=task.get("batch_size"), proximal_mu=float(task.get("proximal_mu", 0.0)),
            lr=lr,
        ).steps  # fmt: skip
    except _StopRequested:
        stopped, done = True, seen["n"] // accum
    now = model.state_dict()
    keys = update_keys(spec.model, local)
    progress = {k: now[k].detach().cpu() - local[k].cpu() for k in keys}
    meta = {"task_id": str(task.get("id", "")), "kind": "progress", "steps": str(done)}
    payload = encode_update(progress, CodecConfig("none"), None, meta)
    try:  # as an update would be: the next task merges it into its start
        decode_any(payload, {k: local[k] for k in keys}, spec.aggregation.max_update_norm)
    except UpdateRejected as exc:
        _write_json(folder / "result.json", {"status": "failed", "reason": "crashed",
                    "detail": f"the continuation made unusable progress: {exc}"})  # fmt: skip
        return EXIT_CRASHED
    _write_bytes(folder / PROGRESS, payload)
    compute_s = time.perf_counter() - started
    _write_json(folder / "result.json", {"status": "ok", "stopped": stopped,
                "metrics": {"steps": done, "compute_s": compute_s}})  # fmt: skip
    _emit(step=done, phase="continued", t=time.time())
    return EXIT_OK


_OOM_TEXT = ("can't allocate memory", "not enough memory", "out of memory")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m desktop.task_runner TASK_FOLDER", file=sys.stderr)
        return 2
    folder = Path(args[0])
    try:
        return run(folder)
    except MemoryError:
        _safe_result(folder, "oom", "out of memory (host)")
        return EXIT_OOM
    except Exception as exc:
        text = str(exc)
        # torch.OutOfMemoryError on a GPU; on the CPU torch's allocator raises a RuntimeError
        if type(exc).__name__ == "OutOfMemoryError" or any(s in text for s in _OOM_TEXT):
            _safe_result(folder, "oom", f"out of memory: {text.splitlines()[0][:300]}")
            return EXIT_OOM
        traceback.print_exc()
        _safe_result(folder, "crashed", f"{type(exc).__name__}: {str(exc)[:500]}")
        return EXIT_CRASHED


def _safe_result(folder: Path, reason: str, detail: str) -> None:
    # the disk may be what failed; the exit code still tells the agent
    with contextlib.suppress(Exception):
        _write_json(
            folder / "result.json", {"status": "failed", "reason": reason, "detail": detail}
        )


if __name__ == "__main__":
    sys.exit(main())
