"""Naive sync, plain FedAvg and network-aware training on the same task, network and seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.sim.adaptive import run_network_aware
from trainer.sim.federated import ProgressFn, RunOptions, run_federated
from trainer.sim.naive import run_naive_sync
from trainer.sim.network import WARM_TASKS, FixedCosts
from trainer.sim.report import SimResult
from trainer.sim.setup import prepare
from trainer.spec import JobSpec, TargetSpec

METHODS = ("naive_sync", "fedavg", "network_aware")
SUMMARY_KEYS = (
    "time_to_target_s",
    "bytes_up_per_node_to_target",
    "final_accuracy",
    "utilization",
    "idle_fraction",
    "rounds_to_target",
    "reached_target",
    "sim_wall_s",
)


def plain_variant(spec: JobSpec) -> JobSpec:
    """Plain FedAvg: full fp32 updates, the spec's equal, fixed local work, wait for everyone."""
    return spec.replace(
        aggregation={**spec.aggregation.model_dump(mode="json"), "strategy": "fedavg"},
        compression={"codec": "none"},
        adaptation={"enabled": False},
        rounds={**spec.rounds.model_dump(mode="json"), "quorum": 1.0, "late_updates": "drop"},
    )


def network_aware_variant(spec: JobSpec) -> JobSpec:
    """The spec as written if it already enables adaptation; otherwise GPUFlex's defaults:
    per-node codecs, a 3/4 quorum with late updates folded in (FedBuff) and overlapped
    communication."""
    if spec.adaptation.enabled:
        return spec
    return spec.replace(
        adaptation={**spec.adaptation.model_dump(mode="json"), "enabled": True},
        compression={**spec.compression.model_dump(mode="json"), "codec": "auto"},
        rounds={**spec.rounds.model_dump(mode="json"), "quorum": 0.75, "late_updates": "stale"},
    )


def run_method(
    method: str,
    spec: JobSpec,
    nodes: int,
    network: str,
    seed: int,
    base_dir: Path | None = None,
    progress: ProgressFn | None = None,
    costs: FixedCosts = WARM_TASKS,
) -> SimResult:
    if method == "naive_sync":
        setup = prepare(spec, nodes, network, seed, base_dir, costs)
        result, _ = run_naive_sync(setup, progress=progress)
    elif method == "fedavg":
        setup = prepare(plain_variant(spec), nodes, network, seed, base_dir, costs)
        result, _ = run_federated(setup, RunOptions(), progress=progress)
    elif method == "network_aware":
        aware = network_aware_variant(spec)
        aware = aware.replace(sharding={"method": "capability"})  # data share by throughput
        setup = prepare(aware, nodes, network, seed, base_dir, costs)
        result, _ = run_network_aware(setup, None, progress)
    else:
        raise ValueError(f"unknown method '{method}'; choose one of {', '.join(METHODS)}")
    return result


def compare(
    spec: JobSpec,
    nodes: int,
    network: str,
    seed: int,
    target: float | None = None,
    base_dir: Path | None = None,
    methods: tuple[str, ...] = METHODS,
    costs: FixedCosts = WARM_TASKS,
) -> dict[str, SimResult]:
    if target is not None:
        rounds = spec.rounds.model_dump(mode="json")
        rounds["target"] = TargetSpec(metric="accuracy", value=target).model_dump()
        spec = spec.replace(rounds=rounds)
    if spec.rounds.target is None:
        raise ValueError("compare needs a target: give --target or rounds.target in the spec")
    return {m: run_method(m, spec, nodes, network, seed, base_dir, costs=costs) for m in methods}


def summary(results: dict[str, SimResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method, result in results.items():
        data = result.to_dict()
        row = {key: data[key] for key in SUMMARY_KEYS}
        row["accuracy_per_round"] = data["accuracy_per_round"]
        row["sim_time_per_round"] = data["sim_time_per_round"]
        out[method] = row
    aware, plain, naive = (results.get(m) for m in METHODS[::-1])
    if aware and plain and naive:
        out["ratios"] = ratios(naive, plain, aware)
    return out


def ratios(naive: SimResult, plain: SimResult, aware: SimResult) -> dict[str, float | None]:
    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "time_aware_over_naive": div(aware.time_to_target_s, naive.time_to_target_s),
        "time_aware_over_fedavg": div(aware.time_to_target_s, plain.time_to_target_s),
        "bytes_fedavg_over_aware": div(plain.bytes_up_to_target, aware.bytes_up_to_target),
        "accuracy_aware_minus_fedavg": aware.final_accuracy - plain.final_accuracy,
    }
