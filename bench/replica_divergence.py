"""How far do honest replicas in different precisions drift apart, and how far do cheats land?

Replicas of one task (same global model, shard, seed, steps and batch) are compared by
marketplace/rounds/verification.py with trainer.replicas.agreement. This measures what that rule
must separate, on the model zoo's models and offline data: the digits MLP and CNN (scikit-
learn's digits) and a small byte transformer on text (the Python standard library's own source
as the corpus). Each case runs FedAvg in fp32 over 4 shards (the marketplace's default), 1 epoch
per task, and at round 0 and at a later round trains shard 0's task again in each precision
through train_local (the product's path, `local.precision`). Every update makes the int8 round
trip that replicated tasks travel with before it is compared:

  fp32 vs fp32 (same task again)  bit-identical on one device
  fp32 vs fp64                    fp32's own rounding: a stand-in for fp32 on another device
                                  with TF32 off (same precision, another summation order)
  fp32 vs bf16, fp16; bf16 vs fp16  honest replicas across precisions
  cheats vs an honest replica     noise of the honest norm, sign flip, another shard's update
                                  from the same round (copy), the same shard's update from the
                                  previous round (stale), zero, scaled x2 and x0.5; the verdict
                                  gives the cheater the claim that helps it (another class)

bf16 autocast on this CPU stands in for a GPU's bf16: in both, autocast rounds the inputs of
matmuls, convolutions and attention to bf16 (8 bits of mantissa) and accumulates in fp32, while
norms, softmax and losses stay fp32. That input rounding is what makes the trajectories drift;
what else differs between the devices (summation order, which kernel runs) is fp32 rounding,
tens of thousands of times smaller (the fp64 row). fp16 keeps a 10-bit mantissa as TF32 does,
so its rows also stand for a CUDA "fp32" replica, which trainer.local runs with TF32 matmuls.
An fp16 row notes any steps fp16's gradient scaler skipped (steps the other replica took).

    python -m bench.replica_divergence               # one to two minutes on 2 cores
    python -m bench.replica_divergence --per-tensor  # and every tensor's distance
    python -m bench.replica_divergence --long        # and the CNN at 4 epochs per task
    python -m bench.replica_divergence --device cuda # and every precision on that device too,
                                                     # against the CPU's fp32 and bf16 replicas
    python -m bench.replica_divergence --json F      # and the rows as JSON into F

Exits 1 when the rule gets a verdict wrong (an honest pair rejected or a cheat accepted).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from trainer.compression import CodecConfig, decode_any, encode_update
from trainer.datasets import Dataset, load_digits_dataset, load_text_dataset
from trainer.local import derive_seed, planned_steps, train_local
from trainer.models import build_model
from trainer.replicas import CROSS_DEVICE_TOLERANCE, Distance, agreement
from trainer.sharding import plan_shards
from trainer.spec import JobSpec, parse_spec

SHARDS = 4  # settings.GPUFLEX["DEFAULT_SHARDS"]
CODEC = CodecConfig("int8")  # what a replicated task travels as (scheduling._lease)
STDLIB_MODULES = ("argparse.py", "inspect.py", "typing.py", "dataclasses.py", "functools.py")
TEXT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    rounds: tuple[int, ...]  # measured from the global model after this many FedAvg rounds
    epochs: float = 1.0  # local work per task
    long: bool = False  # only with --long (slow on a CPU: bf16 there is emulated)


CASES = (
    Case(
        "digits-mlp",
        {  # examples/digits-mlp.yaml
            "model": {"arch": "mlp", "hidden": [128]},
            "optimizer": {"name": "sgd", "lr": 0.2},
        },
        rounds=(0, 8),
    ),
    Case(
        "digits-cnn",
        {  # examples/digits-cnn.yaml
            "model": {"arch": "cnn", "channels": [16, 32]},
            "optimizer": {"name": "sgd", "lr": 0.1},
        },
        rounds=(0, 8),
    ),
    Case(
        "text-transformer",
        {  # desktop/benchmark.py's reference transformer, on bytes of Python source
            "dataset": {"kind": "text", "path": "stdlib.txt", "seq_len": 64},
            "model": {"arch": "transformer", "d_model": 64, "n_layers": 2, "n_heads": 4},
            "optimizer": {"name": "adamw", "lr": 0.003, "weight_decay": 0.01},
        },
        rounds=(0, 3),
    ),
    Case(
        "digits-cnn-4ep",
        {"model": {"arch": "cnn", "channels": [16, 32]}, "optimizer": {"name": "sgd", "lr": 0.1}},
        rounds=(5,),
        epochs=4,
        long=True,
    ),
)


# ------------------------------------------------------------------------------- training


def _with(spec: JobSpec, **local: Any) -> JobSpec:
    return spec.replace(local=spec.local.model_dump() | local)


def train(
    model: torch.nn.Module, start: Mapping[str, Tensor], data: Dataset, spec: JobSpec,
    seed: int, precision: str, steps: int | None = None,
) -> dict[str, Tensor]:  # fmt: skip
    """The product's own path: train_local with the spec's local.precision (`steps`: the
    task's planned steps when None)."""
    local = _with(spec, precision=precision)
    result = train_local(model, start, data, local, seed=seed, steps=steps)
    if result.precision != precision:
        raise RuntimeError(f"asked train_local for {precision}, it ran {result.precision}")
    return result.delta


@contextlib.contextmanager
def skipped_steps() -> Iterator[list[float]]:
    """Counts the optimizer steps fp16's GradScaler skips (inf/NaN gradients: the scale then
    shrinks). A skipped step is one an fp32 or bf16 replica takes, so its effect on agreement
    is shown next to the fp16 rows. Observed from outside: train_local does not report it."""
    skips: list[float] = []
    update = torch.amp.GradScaler.update

    def counting(self: torch.amp.GradScaler, new_scale: Any = None) -> None:
        before = self.get_scale()
        update(self, new_scale)
        if self.get_scale() < before:
            skips.append(before)

    with mock.patch.object(torch.amp.GradScaler, "update", counting):
        yield skips


def train_fp64(
    spec: JobSpec, start: Mapping[str, Tensor], data: Dataset, seed: int
) -> dict[str, Tensor]:
    """The task in float64: its distance to the fp32 run is fp32's own rounding, a stand-in
    for another device's fp32 (same precision, another summation order) with TF32 off."""
    model = build_model(spec.model, data.input_shape, data.num_classes).double()
    x = data.x_train.double() if data.x_train.is_floating_point() else data.x_train
    wide = {k: v.double() for k, v in start.items()}
    result = train_local(model, wide, replace(data, x_train=x), _with(spec, precision="fp32"),
                         seed=seed)  # fmt: skip
    return {k: v.float() for k, v in result.delta.items()}


def travel(update: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The int8 round trip a replicated task's upload makes (agent encodes, server decodes)."""
    decoded, _ = decode_any(encode_update(update, CODEC), reference)
    return decoded


# ------------------------------------------------------------------------------------ data


def _stdlib_corpus(folder: Path) -> Path:
    """A fixed set of standard-library modules: offline, real code, the same on any host of
    one Python version."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join((root / name).read_bytes() for name in STDLIB_MODULES)[:TEXT_BYTES]
    path = folder / "stdlib.txt"
    path.write_bytes(text[: text.rfind(b"\n") + 1])
    return path


def _dataset(spec: JobSpec, folder: Path) -> Dataset:
    if spec.dataset.kind == "text":
        return load_text_dataset(_stdlib_corpus(folder), spec.dataset.seq_len, 0.2, spec.seed)
    return load_digits_dataset(spec.dataset.test_fraction, spec.seed)


def _shard_data(data: Dataset) -> list[Dataset]:
    shards = plan_shards(data, SHARDS, "stratified", seed=0)
    return [data.subset(torch.from_numpy(shard.indices)) for shard in shards]


# ----------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Row:
    case: str
    round: int
    steps: int
    label: str
    claims: tuple[str, str]  # precision classes claimed by the two sides
    dist: Distance
    agreed: bool
    cheat: bool


def _cheats(
    honest: Mapping[str, Tensor],
    other_shard: Mapping[str, Tensor],
    previous: Mapping[str, Tensor] | None,
    seed: int,
) -> Iterator[tuple[str, dict[str, Tensor]]]:
    gen = torch.Generator().manual_seed(seed)

    def noise(t: Tensor) -> Tensor:
        z = torch.randn(t.shape, generator=gen)
        return z * (t.norm() / z.norm().clamp_min(1e-30))  # the honest tensor's norm

    yield "noise (same norm)", {k: noise(v) for k, v in honest.items()}
    yield "sign flip", {k: -v for k, v in honest.items()}
    yield "copy (other shard)", dict(other_shard)
    if previous is not None:
        yield "stale (prev round)", dict(previous)
    yield "zero", {k: torch.zeros_like(v) for k, v in honest.items()}
    yield "scaled x2", {k: 2 * v for k, v in honest.items()}
    yield "scaled x0.5", {k: 0.5 * v for k, v in honest.items()}


def _other(precision: str) -> str:
    return "bf16" if precision == "fp32" else "fp32"


def measure_case(case: Case, folder: Path, device: str | None = None) -> list[Row]:
    spec = parse_spec(
        {"name": case.name, "seed": 0, "local": {"epochs": case.epochs, "batch_size": 32}}
        | case.spec
    )
    data = _dataset(spec, folder)
    shards = _shard_data(data)
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows: list[Row] = []
    previous: dict[str, Tensor] | None = None  # shard 0's honest update last round
    for rnd in range(max(case.rounds) + 1):
        seeds = [derive_seed(spec.seed, rnd, s) for s in range(SHARDS)]
        deltas = [train(model, state, shards[s], spec, seeds[s], "fp32") for s in range(SHARDS)]
        if rnd in case.rounds:
            found, honest = _compare(case.name, rnd, spec, model, state, shards, seeds, deltas,
                                     previous)  # fmt: skip
            rows += found
            if device is not None:
                rows += _compare_device(case.name, rnd, spec, model, state, shards[0], seeds[0],
                                        honest, device)  # fmt: skip
        previous = deltas[0]
        mean = {k: sum(d[k] for d in deltas) / len(deltas) for k in state}
        state = {k: state[k] + mean[k] for k in state}
    return rows


def _compare(
    case: str, rnd: int, spec: JobSpec, model: torch.nn.Module, state: dict[str, Tensor],
    shards: list[Dataset], seeds: list[int], deltas: list[dict[str, Tensor]],
    previous: dict[str, Tensor] | None,
) -> tuple[list[Row], dict[str, dict[str, Tensor]]]:  # fmt: skip
    """Shard 0's task in every precision against itself and against each cheat; the rows,
    and the honest replicas by precision, as they travelled."""
    steps = planned_steps(spec, shards[0].num_train)
    honest = {"fp32": travel(deltas[0], state)}
    honest["bf16"] = travel(train(model, state, shards[0], spec, seeds[0], "bf16"), state)
    with skipped_steps() as skips:
        honest["fp16"] = travel(train(model, state, shards[0], spec, seeds[0], "fp16"), state)
    fp16 = f"honest, {len(skips)} skipped" if skips else "honest"
    again = travel(train(model, state, shards[0], spec, seeds[0], "fp32"), state)
    wide = travel(train_fp64(spec, state, shards[0], seeds[0]), state)

    def row(label: str, a: str, b: str, upload: Mapping[str, Tensor], cheat: bool) -> Row:
        verdict = agreement(honest[a], upload, a, b)
        return Row(case, rnd, steps, label, (a, b), verdict.distance, verdict.agreed, cheat)

    rows = [
        row("fp32 vs fp32 (same task again)", "fp32", "fp32", again, False),
        row("fp32 vs fp64 (fp32 rounding)", "fp32", "fp32", wide, False),
        row("fp32 vs bf16 (honest)", "fp32", "bf16", honest["bf16"], False),
        row(f"fp32 vs fp16 ({fp16})", "fp32", "fp16", honest["fp16"], False),
        row(f"bf16 vs fp16 ({fp16})", "bf16", "fp16", honest["fp16"], False),
    ]
    # each cheat against each honest replica, claiming the class that helps it most
    for label, fake in _cheats(deltas[0], deltas[1], previous, seeds[0]):
        upload = travel(fake, state)
        for ref in ("fp32", "bf16"):
            rows.append(row(f"{label} vs {ref}", ref, _other(ref), upload, True))
    return rows, honest


def _compare_device(
    case: str, rnd: int, spec: JobSpec, model: torch.nn.Module, state: dict[str, Tensor],
    shard: Dataset, seed: int, cpu: Mapping[str, Mapping[str, Tensor]], device: str,
) -> list[Row]:  # fmt: skip
    """Shard 0's task trained on `device` in each precision (fp32 there is TF32 on CUDA),
    against the CPU's fp32 and bf16 replicas of the same task (`cpu`, as they travelled):
    mixed hardware, honestly."""
    steps = planned_steps(spec, shard.num_train)
    on = copy.deepcopy(model).to(device)
    start = {k: v.to(device) for k, v in state.items()}
    rows = []
    for precision in ("fp32", "bf16", "fp16"):
        with skipped_steps() as skips:
            upload = travel(train(on, start, shard, spec, seed, precision), state)
        note = f", {len(skips)} skipped" if skips else ""
        for ref in ("fp32", "bf16"):
            verdict = agreement(cpu[ref], upload, ref, precision)
            label = f"cpu {ref} vs {device} {precision} (honest{note})"
            rows.append(Row(case, rnd, steps, label, (ref, precision), verdict.distance,
                            verdict.agreed, False))  # fmt: skip
    return rows


# ------------------------------------------------------------------------------- report


def _print(rows: list[Row], per_tensor: bool) -> None:
    head = f"{'model':17} {'rnd':>3} {'steps':>5}  {'pair':34} {'claims':10}"
    head += f" {'rel L2':>8} {'cosine':>8} {'worst tensor L2':>16}  verdict"
    print(head)
    print("-" * len(head))
    for r in rows:
        d = r.dist
        wrong = r.agreed == r.cheat
        verdict = ("agree" if r.agreed else "reject") + ("  <-- WRONG" if wrong else "")
        print(
            f"{r.case:17} {r.round:>3} {r.steps:>5}  {r.label:34} {'/'.join(r.claims):10}"
            f" {d.relative_l2:8.4f} {d.cosine:8.4f} {d.worst_tensor_l2:16.4f}  {verdict}"
        )
        if per_tensor and not r.cheat:
            for name, value in d.per_tensor.items():
                print(f"{'':65}{name:>30} {value:8.4f}")


def _row_json(r: Row) -> dict[str, Any]:
    d = r.dist
    return {"case": r.case, "round": r.round, "steps": r.steps, "pair": r.label,
            "claims": list(r.claims), "relative_l2": d.relative_l2, "cosine": d.cosine,
            "worst_tensor_l2": d.worst_tensor_l2, "agreed": r.agreed, "cheat": r.cheat}  # fmt: skip


def _summary(rows: list[Row]) -> None:
    def worst(label: str, picked: list[Row]) -> None:
        if not picked:
            return
        print(
            f"{label:34} rel L2 {min(r.dist.relative_l2 for r in picked):.2e} .. "
            f"{max(r.dist.relative_l2 for r in picked):.4f}, cosine >= "
            f"{min(r.dist.cosine for r in picked):.4f}, worst tensor <= "
            f"{max(r.dist.worst_tensor_l2 for r in picked):.4f}"
        )

    print()
    worst("same task, same device", [r for r in rows if "same task" in r.label])
    worst("fp32 vs fp64 (fp32 rounding)", [r for r in rows if "fp64" in r.label])
    honest = [r for r in rows if "honest" in r.label]
    worst("honest across precisions", [r for r in honest if "skipped" not in r.label])
    worst("honest, fp16 having skipped steps", [r for r in honest if "skipped" in r.label])
    worst("cheats", [r for r in rows if r.cheat])
    wrong = [r for r in rows if r.agreed == r.cheat]
    print(
        f"verdicts (cross-device tolerance {CROSS_DEVICE_TOLERANCE}): "
        f"{len(rows) - len(wrong)} right, {len(wrong)} wrong"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--per-tensor", action="store_true", help="every tensor's distance")
    parser.add_argument("--long", action="store_true", help="also 4 epochs per task (slow)")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    parser.add_argument("--device", help="also train every precision on this device (cuda)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"train_local, codec {CODEC.name}, {SHARDS} shards, {torch.get_num_threads()} threads\n")
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            if (case.long and not args.long) or (args.case and case.name not in args.case):
                continue
            rows += measure_case(case, Path(tmp), args.device)
    _print(rows, args.per_tensor)
    if args.json:
        args.json.write_text(json.dumps([_row_json(r) for r in rows], indent=1))
    _summary(rows)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 1 if any(r.agreed == r.cheat for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
