"""Exported models (model.arch: exported, issue 33): the figures `python -m bench.run --only
exported` writes to results.json `exported`.

- accuracy: an exported copy of the zoo's digits MLP (examples/digits-mlp.yaml, the same
  initial weights) against the zoo MLP, same seed, same rounds, on the simulator;
- throughput: train_local samples/s on the exported program against the same module trained
  in eager mode (the zoo MLP, and the custom VGG of examples/custom-vgg), CPU, fp32;
- checking: a 25M-parameter program through the request's gate (zip and JSON, no torch)
  and the worker's measurement (deserialized on the meta device, one sample's activations).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 20
NODES = 4
STEPS = 400
ROUNDS_TIMED = 7


def _spec(program: Path | None) -> Any:
    from trainer.spec import parse_spec

    data = yaml.safe_load((ROOT / "examples" / "digits-mlp.yaml").read_text())
    data["rounds"] = {"max_rounds": ROUNDS}
    if program is not None:
        data["model"] = {"arch": "exported", "program": str(program)}
    return parse_spec(data)


def accuracy(folder: Path) -> dict[str, Any]:
    """The same rounds, the same seed: the zoo MLP and its exported copy."""
    from trainer.exported.export import export_program
    from trainer.models import build_model
    from trainer.sim.federated import RunOptions, run_federated
    from trainer.sim.setup import prepare

    zoo_spec = _spec(None)
    zoo = build_model(zoo_spec.model, (64,), 10, seed=zoo_spec.seed)
    program = export_program(
        zoo, F.cross_entropy, (torch.zeros(4, 64), torch.zeros(4, dtype=torch.long)),
        folder / "mlp.pt2",
    )  # fmt: skip
    out: dict[str, Any] = {"rounds": ROUNDS, "nodes": NODES}
    for label, spec in (("zoo", zoo_spec), ("exported", _spec(program))):
        setup = prepare(spec, NODES, "lan", seed=spec.seed)
        result, _ = run_federated(setup, RunOptions(stop_at_target=False))
        out[label] = [round(a, 4) for a in result.accuracy_per_round]
    out["max_abs_diff"] = max(abs(a - b) for a, b in zip(out["zoo"], out["exported"],
                                                         strict=True))  # fmt: skip
    return out


def _samples_per_s(models: list[tuple[nn.Module, Any]], data: Any) -> list[float]:
    """Best of ROUNDS_TIMED runs each, the models' runs interleaved so that a busy machine
    slows them alike."""
    from trainer.local import train_local

    states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m, _ in models]
    for (model, spec), state in zip(models, states, strict=True):
        train_local(model, state, data, spec, seed=0, steps=10)  # warm up
    best = [0.0] * len(models)
    for _ in range(ROUNDS_TIMED):
        for i, ((model, spec), state) in enumerate(zip(models, states, strict=True)):
            started = time.perf_counter()
            result = train_local(model, state, data, spec, seed=0, steps=STEPS)
            wall = time.perf_counter() - started
            best[i] = max(best[i], result.steps * spec.local.batch_size / wall)
    return best


def throughput(folder: Path) -> dict[str, Any]:
    """Best of ROUNDS_TIMED STEPS-step runs of train_local, eager module against its program."""
    import importlib.util

    from trainer.datasets import load_dataset
    from trainer.exported.export import WithLoss, export_program
    from trainer.models import build_model
    from trainer.spec import DatasetSpec

    data = load_dataset(DatasetSpec(), seed=0)
    path = ROOT / "examples" / "custom-vgg" / "model.py"
    found = importlib.util.spec_from_file_location("custom_vgg", path)
    assert found is not None and found.loader is not None
    vgg_module = importlib.util.module_from_spec(found)
    found.loader.exec_module(vgg_module)
    rows = {}
    example = (torch.zeros(4, 64), torch.zeros(4, dtype=torch.long))
    for label, make in (("mlp", lambda: build_model(_spec(None).model, (64,), 10)),
                        ("custom_vgg", lambda: vgg_module.SmallVGG())):  # fmt: skip
        eager_spec = _spec(None).replace(local={"steps": STEPS, "batch_size": 32,
                                                "precision": "fp32"})  # fmt: skip
        program_path = export_program(make(), F.cross_entropy, example, folder / f"{label}.pt2")
        program_spec = _spec(program_path).replace(local=eager_spec.local)
        program = build_model(program_spec.model, (64,), 10)
        # the eager side is the same module and loss, unexported (WithLoss, as exported)
        eager = _Eager(WithLoss(make(), F.cross_entropy))
        eager.load_state_dict(program.state_dict())
        eager_sps, program_sps = _samples_per_s([(eager, eager_spec), (program, program_spec)],
                                                data)  # fmt: skip
        rows[label] = {"eager_samples_per_s": round(eager_sps, 1),
                       "exported_samples_per_s": round(program_sps, 1),
                       "ratio": round(program_sps / eager_sps, 3)}  # fmt: skip
    return {"steps": STEPS, "batch_size": 32, "threads": torch.get_num_threads(),
            "runs": ROUNDS_TIMED, **rows}  # fmt: skip


class _Eager(nn.Module):
    """The eager module run as train_local runs a program (trainer.exported.runtime)."""

    gpuflex_program = True

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return self.inner(x, y)

    def state_dict(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        return {k.removeprefix("inner."): v for k, v in super().state_dict(*args, **kwargs).items()}

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):  # type: ignore[override]
        return super().load_state_dict({f"inner.{k}": v for k, v in state.items()}, strict, assign)


def check_time(folder: Path) -> dict[str, Any]:
    """A ~25M-parameter MLP program: export, the request's gate, the worker's measurement."""
    from trainer.exported.archive import read_archive
    from trainer.exported.export import export_program
    from trainer.exported.gate import check_program
    from trainer.fit import measure_footprint
    from trainer.spec import ModelSpec

    net = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                        nn.Linear(4096, 2048), nn.ReLU(), nn.Linear(2048, 10))  # fmt: skip
    params = sum(p.numel() for p in net.parameters())
    started = time.perf_counter()
    path = export_program(net, F.cross_entropy, (torch.zeros(4, 64),
                          torch.zeros(4, dtype=torch.long)), folder / "big.pt2")  # fmt: skip
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    check_program(read_archive(path, 2**30))
    gate_s = time.perf_counter() - started
    started = time.perf_counter()
    footprint = measure_footprint(ModelSpec(arch="exported", program=str(path)), (64,), 10)
    measure_s = time.perf_counter() - started
    return {"parameters": params, "archive_mb": round(path.stat().st_size / 2**20, 1),
            "export_s": round(export_s, 2), "request_gate_s": round(gate_s, 2),
            "worker_measure_s": round(measure_s, 2),
            "measured_parameters": footprint.parameters}  # fmt: skip


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuflex-exported-bench-") as tmp:
        folder = Path(tmp)
        print("exported: zoo MLP against its exported copy on the simulator")
        acc = accuracy(folder)
        print("exported: train_local samples/s, program against eager")
        speed = throughput(folder)
        print("exported: checking a 25M-parameter program")
        check = check_time(folder)
    return {"accuracy": acc, "throughput": speed, "check": check}


def render(r: dict[str, Any]) -> list[str]:
    a, t, c = r["accuracy"], r["throughput"], r["check"]
    rows = [f"| {name} | {v['eager_samples_per_s']:,.0f} | {v['exported_samples_per_s']:,.0f} "
            f"| {v['ratio']:.3f} |" for name, v in t.items() if isinstance(v, dict)]  # fmt: skip
    return [
        "## Exported models (`model.arch: exported`)",
        "",
        f"Digits MLP, {a['nodes']} simulated nodes, {a['rounds']} rounds, same seed: final "
        f"accuracy zoo {a['zoo'][-1]:.4f}, exported {a['exported'][-1]:.4f}; largest "
        f"difference over the rounds {a['max_abs_diff']:.4f} (goal ≤ 0.01).",
        "",
        f"train_local on CPU, fp32, batch {t['batch_size']}, {t['steps']} steps, "
        f"{t['threads']} thread(s), best of {t.get('runs', 3)} interleaved runs "
        "(goal: ratio ≥ 0.95):",
        "",
        "| model | eager samples/s | exported samples/s | ratio |",
        "|---|---:|---:|---:|",
        *rows,
        "",
        f"A {c['parameters']:,}-parameter program ({c['archive_mb']} MiB): exported in "
        f"{c['export_s']} s; the request's gate (zip and JSON, no torch) {c['request_gate_s']} s; "
        f"the worker's measurement (meta device) {c['worker_measure_s']} s "
        "(`python -m bench.run --only exported`).",
        "",
    ]
