"""The digits sweep (`python -m bench.run --only sweep`): examples/digits-sweep.yaml's 16
trials against examples/digits-mlp.yaml, rounds to 0.95 held-out accuracy.

In-process, through the real trainer (the simulator's FedAvg rounds over NODES nodes on a LAN
profile, trainer.sim) and the sweep's own driver (trainer.sweep: the TPE asks and the median
pruner the marketplace uses): a 16-trial sweep through the marketplace with real agents takes
far longer than a bench on this machine should. The trials are asked `sweep.parallel` at a
time (each ask seeing the others of its batch as running, as the marketplace's are) and run
one after another; after each round a trial's error rate is reported, and the pruner may stop
it there. The baseline is digits-mlp.yaml itself, run in the same process on the same nodes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainer import sweep as study
from trainer.sim.federated import RunOptions, equal_work, run_federated
from trainer.sim.report import RoundLog
from trainer.sim.setup import prepare
from trainer.spec import JobSpec, load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NODES = 4


class _Pruned(Exception):
    """Raised from the round callback to stop a trial the pruner stops."""


def _rounds_to_target(spec: JobSpec) -> int | None:
    setup = prepare(spec, NODES, "lan", seed=spec.seed)
    result, _ = run_federated(setup, RunOptions())
    return result.rounds_to_target


def _samples_per_round(spec: JobSpec) -> int:
    """Samples trained per round over all nodes (steps x batch): what a round costs, so
    that fewer rounds bought with more local work shows as such."""
    setup = prepare(spec, NODES, "lan", seed=spec.seed)
    return sum(w.steps * w.batch_size for w in equal_work(setup))


def _run_trial(sweep_spec: JobSpec, record: study.TrialRecord, records: list) -> int:
    """Train trial `record` round by round, reporting and maybe pruning; returns rounds run."""
    sweep = sweep_spec.sweep
    assert sweep is not None
    spec = study.trial_spec(sweep_spec, record.params, record.number)
    rounds = 0

    def report(log: RoundLog) -> None:
        nonlocal rounds
        rounds = log.round
        value = study.round_value(sweep, {"accuracy": log.accuracy})
        if value is not None:
            record.intermediate[log.round] = value
        if study.should_prune(sweep, records, record.number):
            raise _Pruned

    setup = prepare(spec, NODES, "lan", seed=spec.seed)
    try:
        result, _ = run_federated(setup, RunOptions(), progress=report)
    except _Pruned:
        record.state = study.PRUNED
        return rounds
    record.state = study.COMPLETED
    record.value = study.final_value(
        sweep, rounds_done=result.rounds, reached_target=result.rounds_to_target is not None,
        max_rounds=spec.rounds.max_rounds, last_metrics={"accuracy": result.final_accuracy},
    )  # fmt: skip
    return result.rounds


def run() -> dict[str, Any]:
    started = time.perf_counter()
    baseline_spec = load_spec(EXAMPLES / "digits-mlp.yaml")
    baseline = _rounds_to_target(baseline_spec)
    sweep_spec = load_spec(EXAMPLES / "digits-sweep.yaml")
    sweep = sweep_spec.sweep
    assert sweep is not None
    records: list[study.TrialRecord] = []
    rows = []
    while len(records) < sweep.trials:
        batch = []
        for _ in range(min(sweep.parallel, sweep.trials - len(records))):
            params = study.ask(sweep, records, sweep_spec.seed)
            batch.append(study.TrialRecord(len(records), params))
            records.append(batch[-1])
        for record in batch:
            rounds = _run_trial(sweep_spec, record, records)
            rows.append({"number": record.number, "params": record.params, "state": record.state,
                         "rounds": rounds, "value": record.value})  # fmt: skip
            print(f"  trial {record.number}: {record.state} after {rounds} rounds "
                  f"(value {record.value}) {record.params}")  # fmt: skip
    best = study.best(sweep, records)
    assert best is not None
    best_rounds = int(best.value) if best.value is not None else None
    reached = best_rounds is not None and best_rounds <= sweep_spec.rounds.max_rounds
    best_spec = study.trial_spec(sweep_spec, best.params, best.number)
    base_samples, best_samples = _samples_per_round(baseline_spec), _samples_per_round(best_spec)
    return {
        "baseline_samples_per_round": base_samples,
        "best_samples_per_round": best_samples,
        "baseline_samples_to_0_95": base_samples * baseline if baseline else None,
        "best_samples_to_0_95": best_samples * best_rounds if reached and best_rounds else None,
        "nodes": NODES,
        "trials": sweep.trials,
        "baseline_rounds_to_0_95": baseline,
        "best_trial": best.number,
        "best_params": best.params,
        "best_rounds_to_0_95": best_rounds if reached else None,
        "best_local_steps": best_spec.local.steps,
        "rounds_ratio": (best_rounds / baseline) if reached and baseline and best_rounds else None,
        "pruned": sum(r.state == study.PRUNED for r in records),
        "rounds_run": sum(r["rounds"] for r in rows),
        "rows": rows,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in params.items())  # fmt: skip


def render(data: dict[str, Any]) -> list[str]:
    ratio = data["rounds_ratio"]
    lines = [
        "## Hyperparameter sweep (digits, 16 trials, trainer in process)",
        "",
        f"examples/digits-sweep.yaml's {data['trials']} trials (TPE, median pruner) against "
        f"examples/digits-mlp.yaml, FedAvg over {data['nodes']} simulated nodes, rounds to "
        "0.95 held-out accuracy, both measured in this process (`python -m bench.run --only "
        "sweep`; bench/sweep_bench.py says how it differs from a sweep through the marketplace).",
        "",
        f"- digits-mlp.yaml: **{data['baseline_rounds_to_0_95']}** rounds to 0.95",
        f"- best trial (#{data['best_trial']}): **{data['best_rounds_to_0_95']}** rounds to 0.95 "
        f"({_f(ratio)} of the baseline's), with {_params(data['best_params'])}",
        f"- samples trained to 0.95 (rounds x local steps x batch, all nodes): "
        f"{data['baseline_samples_to_0_95']:,} for digits-mlp.yaml "
        f"({data['baseline_samples_per_round']:,} a round), {data['best_samples_to_0_95']:,} for "
        f"the best trial ({data['best_samples_per_round']:,} a round)",
        f"- {data['pruned']} of {data['trials']} trials pruned; {data['rounds_run']} rounds run "
        f"in all; {data['wall_s']} s wall",
        "",
        "| trial | state | rounds | value | parameters |",
        "|---:|---|---:|---:|---|",
    ]
    for r in data["rows"]:
        value = "—" if r["value"] is None else f"{r['value']:g}"
        lines.append(f"| {r['number']} | {r['state']} | {r['rounds']} | {value} | "
                     f"{_params(r['params'])} |")  # fmt: skip
    return lines


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
