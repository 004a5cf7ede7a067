"""Exported models (model.arch: exported, issue 33): the figures `python -m bench.run --only
exported` writes to results.json `exported`.

- accuracy: an exported copy of the zoo's digits MLP (examples/digits-mlp.yaml, the same
  initial weights) against the zoo MLP, same seed, same rounds, on the simulator;
- throughput: train_local samples/s on the exported program against the same module trained
  in eager mode (the zoo MLP, and the custom VGG of examples/custom-vgg), CPU, fp32;
- checking: a 25M-parameter program through the request's gate (zip and JSON, no torch)
  and the worker's measurement (deserialized on the meta device, one sample's activations);
- live: the same comparison through real processes (`gpuflex serve`, the Celery worker and
  LIVE_NODES `gpuflex-node` agents, `gpuflex demo`'s machinery as bench.live_bench runs it),
  LIVE_ROUNDS rounds each, with what each round aggregated (shard, node, steps, the update's
  training loss), since real agents' scheduling may differ between the two runs.

    python -m bench.exported_bench --live zoo|exported   one real run, JSON on stdout
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
LIVE_ROUNDS = 4
LIVE_NODES = ("live-a", "live-b", "live-c")
LIVE_TIMEOUT_S = 600.0


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


def _export_zoo(folder: Path) -> Path:
    """The zoo's digits MLP with the spec's initial weights, exported with the zoo's loss."""
    from trainer.exported.export import export_program
    from trainer.models import build_model

    spec = _spec(None)
    zoo = build_model(spec.model, (64,), 10, seed=spec.seed)
    example = (torch.zeros(4, 64), torch.zeros(4, dtype=torch.long))
    return export_program(zoo, F.cross_entropy, example, folder / "mlp.pt2")


def live_spec(folder: Path, label: str) -> Path:
    """examples/digits-mlp.yaml for LIVE_ROUNDS rounds on one shard per agent, as the zoo MLP
    or (label "exported") as its exported copy beside the spec file (uploaded with it). The
    target is out of reach, so both run every round."""
    data = yaml.safe_load((ROOT / "examples" / "digits-mlp.yaml").read_text())
    data["name"] = f"live-{label}"
    data["rounds"] = {"max_rounds": LIVE_ROUNDS, "target": {"metric": "accuracy", "value": 0.999}}
    data["sharding"] = {"method": "stratified", "num_shards": len(LIVE_NODES)}
    if label == "exported":
        data["model"] = {"arch": "exported", "program": _export_zoo(folder).name}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def live_one(label: str) -> dict[str, Any]:
    """One real run (its own demo database; Django set up in this process)."""
    os.environ.setdefault("GPUFLEX_WARM_TASKS", "1")
    from marketplace.demo.cluster import NodePlan
    from marketplace.demo.run import Options
    from marketplace.demo.run import run as run_demo

    nodes = tuple(NodePlan(n, kind="platform", profile="lan", price="3.00") for n in LIVE_NODES)
    with tempfile.TemporaryDirectory(prefix="gpuflex-exported-live-") as tmp:
        spec = live_spec(Path(tmp), label)
        s = run_demo(Options(data_dir=Path(tmp) / "demo", spec=spec, nodes=nodes, quiet=True,
                             target=0.999, budget="20.00", timeout_s=LIVE_TIMEOUT_S))  # fmt: skip
    return {"status": s["status"], "rounds": s["rounds"],
            "accuracy_per_round": s["accuracy_per_round"],
            "aggregated": _aggregated(s["job_id"]), "wall_s": s["wall_s"]}  # fmt: skip


def _aggregated(job_id: str) -> list[list[dict[str, Any]]]:
    """Per round, the updates its aggregation took, by shard: which node, how many steps,
    the update's own training loss."""
    from marketplace.rounds.models import TaskResult

    rows = TaskResult.objects.filter(task__round__job_id=job_id, aggregated=True).values_list(
        "task__round__number", "task__shard__index", "node__name", "task__steps", "metrics"
    )
    rounds: dict[int, list[dict[str, Any]]] = {}
    for number, shard, node, steps, metrics in sorted(rows, key=lambda r: (r[0], r[1] or 0)):
        loss = (metrics or {}).get("loss")
        loss = round(loss, 6) if isinstance(loss, float) else loss
        update = {"shard": shard, "node": node, "steps": steps, "loss": loss}
        rounds.setdefault(number, []).append(update)
    return [rounds[n] for n in sorted(rounds)]


def live() -> dict[str, Any]:
    """The zoo MLP, then its exported copy, each through real processes (a subprocess each:
    every run sets up Django on its own demo database)."""
    out: dict[str, Any] = {"rounds": LIVE_ROUNDS, "agents": len(LIVE_NODES)}
    for label in ("zoo", "exported"):
        cmd = [sys.executable, "-m", "bench.exported_bench", "--live", label]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=LIVE_TIMEOUT_S + 300)  # fmt: skip
        except subprocess.TimeoutExpired:
            return out | {"error": f"{label}: no result within {LIVE_TIMEOUT_S + 300:.0f} s"}
        if done.returncode != 0:
            return out | {"error": f"{label}: {done.stderr.strip()[-500:]}"}
        out[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return out | compare(out["zoo"], out["exported"])


def compare(zoo_run: dict[str, Any], exp_run: dict[str, Any]) -> dict[str, Any]:
    """The two real runs side by side: accuracy, and what each round aggregated."""
    out: dict[str, Any] = {}
    zoo, exp = zoo_run["accuracy_per_round"], exp_run["accuracy_per_round"]
    out["max_abs_diff"] = max((abs(a - b) for a, b in zip(zoo, exp, strict=False)), default=None)
    out["same_rounds"] = len(zoo) == len(exp)
    out["within_0_01"] = bool(out["same_rounds"] and out["max_abs_diff"] is not None
                              and out["max_abs_diff"] <= 0.01)  # fmt: skip
    # the same shards trained in every round (which node trained one does not change it: a
    # task's seed is the job's seed, round and shard index, trainer.local.derive_seed)
    took = (zoo_run["aggregated"], exp_run["aggregated"])
    shards = [[[u["shard"] for u in r] for r in t] for t in took]
    out["same_shards_aggregated"] = shards[0] == shards[1]
    pairs = [(a, b) for ra, rb in zip(*took, strict=False) for a, b in zip(ra, rb, strict=False)]
    # the agents' scheduling: a shard trained by another node in the other run
    out["updates_on_other_node"] = sum(a["node"] != b["node"] for a, b in pairs)
    out["updates"] = len(pairs)
    # each update's training loss as its node reported it, the same in both runs?
    out["same_update_losses"] = all(a["loss"] == b["loss"] for a, b in pairs)
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


def throughput(folder: Path, device: str = "cpu") -> dict[str, Any]:
    """Best of ROUNDS_TIMED STEPS-step runs of train_local, eager module against its program,
    both on `device`."""
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
        program, eager = program.to(device), eager.to(device)
        eager_sps, program_sps = _samples_per_s([(eager, eager_spec), (program, program_spec)],
                                                data)  # fmt: skip
        rows[label] = {"eager_samples_per_s": round(eager_sps, 1),
                       "exported_samples_per_s": round(program_sps, 1),
                       "ratio": round(program_sps / eager_sps, 3)}  # fmt: skip
    return {"steps": STEPS, "batch_size": 32, "threads": torch.get_num_threads(),
            "runs": ROUNDS_TIMED, "device": device, **rows}  # fmt: skip


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
    print("exported: zoo MLP against its exported copy through real agents")
    real = live()
    return {"accuracy": acc, "throughput": speed, "check": check, "live": real}


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
        *_render_cuda(r.get("throughput_cuda")),
        f"A {c['parameters']:,}-parameter program ({c['archive_mb']} MiB): exported in "
        f"{c['export_s']} s; the request's gate (zip and JSON, no torch) {c['request_gate_s']} s; "
        f"the worker's measurement (meta device) {c['worker_measure_s']} s "
        "(`python -m bench.run --only exported`).",
        "",
        *_render_live(r.get("live")),
    ]


def _render_cuda(t: dict[str, Any] | None) -> list[str]:
    """The same measurement on a GPU (`python -m bench.exported_bench --throughput cuda`), run
    where one was lent; absent elsewhere."""
    if not t:
        return []
    rows = [f"{name} {v['ratio']:.3f} ({v['exported_samples_per_s']:,.0f} against "
            f"{v['eager_samples_per_s']:,.0f} samples/s)"
            for name, v in t.items() if isinstance(v, dict)]  # fmt: skip
    return [f"On {t.get('gpu', 'a GPU')} (fp32 with TF32, batch {t['batch_size']}, "
            f"{t['steps']} steps, best of {t['runs']}; {t.get('measured', '')}): exported/eager "
            + ", ".join(rows) + ".", ""]  # fmt: skip


def _render_live(v: dict[str, Any] | None) -> list[str]:
    if not v:
        return []
    head = (f"Through real processes (`gpuflex serve`, the Celery worker, {v['agents']} "
            f"`gpuflex-node` agents), digits MLP, {v['rounds']} rounds, same seed")  # fmt: skip
    if "error" in v:
        return [f"{head}: no figure, {v['error']}", ""]
    zoo, exp = v["zoo"], v["exported"]
    rows = []
    for i, (a, b) in enumerate(zip(zoo["accuracy_per_round"], exp["accuracy_per_round"],
                                   strict=False), 1):  # fmt: skip
        took = [zoo["aggregated"][i - 1], exp["aggregated"][i - 1]]
        shards = [",".join(str(u["shard"]) for u in t) for t in took]
        rows.append(f"| {i} | {a:.4f} | {b:.4f} | {abs(a - b):.4f} | {shards[0]} | {shards[1]} |")
    verdict = "within" if v["within_0_01"] else "NOT within"
    return [
        f"{head}: largest difference {v['max_abs_diff']:.4f}, {verdict} 0.01; the same "
        f"shards aggregated in every round: {'yes' if v['same_shards_aggregated'] else 'no'}; "
        f"{v['updates_on_other_node']} of {v['updates']} updates trained by another node than "
        "in the other run; each update's training loss the same in both: "
        f"{'yes' if v['same_update_losses'] else 'no'}.",
        "",
        "| round | zoo accuracy | exported accuracy | difference | zoo shards | exported shards |",
        "|---:|---:|---:|---:|---|---|",
        *rows,
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="bench.exported_bench")
    parser.add_argument("--live", choices=("zoo", "exported"),
                        help="one real run of the digits MLP, zoo or exported")  # fmt: skip
    parser.add_argument(
        "--throughput",
        metavar="DEVICE",
        help="train_local samples/s, program against eager, on DEVICE (cuda)",
    )
    args = parser.parse_args(argv)
    if args.throughput:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(throughput(Path(tmp), args.throughput)))
    elif args.live:
        print(json.dumps(live_one(args.live)))
    else:
        parser.error("name --live or --throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
