"""`gpuflex-sim`: run a job spec on simulated nodes over a simulated network."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from tqdm import tqdm

from trainer.datasets import DatasetError
from trainer.sharding import ShardingError
from trainer.sim.adaptive import run_network_aware
from trainer.sim.compare import METHODS, compare, summary
from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.naive import run_naive_sync
from trainer.sim.network import FIXED_COSTS, PROFILES, FixedCosts, UnknownProfile
from trainer.sim.report import RoundLog, SimResult
from trainer.sim.setup import prepare
from trainer.spec import JobSpec, SpecError, load_spec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuflex-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train SPEC on N simulated nodes and report")
    run.add_argument("spec", type=Path)
    run.add_argument("--nodes", type=int, default=8)
    run.add_argument("--network", default="lan", help=f"one of: {', '.join(PROFILES)}")
    run.add_argument("--seed", type=int, default=None, help="defaults to the spec's seed")
    run.add_argument(
        "--method", choices=["federated", "naive"], default="federated", help="naive: sync DP"
    )
    run.add_argument("--rounds", type=int, default=None, help="override rounds.max_rounds")
    run.add_argument("--checkpoint", type=Path, help="save a checkpoint here after every round")
    run.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    run.add_argument("--provenance", type=Path, help="store the provenance artifacts here")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    _add_cost_flags(run)

    cmp = sub.add_parser("compare", help="naive sync vs plain FedAvg vs network-aware training")
    cmp.add_argument("spec", type=Path)
    cmp.add_argument("--nodes", type=int, default=8)
    cmp.add_argument("--network", default="wan", help=f"one of: {', '.join(PROFILES)}")
    cmp.add_argument("--seed", type=int, default=None, help="defaults to the spec's seed")
    cmp.add_argument("--target", type=float, default=None, help="accuracy to reach, e.g. 0.95")
    cmp.add_argument("--json", action="store_true", help="print one JSON object")
    _add_cost_flags(cmp)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got '{text}'") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _add_cost_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fixed-costs",
        choices=FIXED_COSTS,
        default="warm",
        help="fixed per-task and per-round costs as the rounds bench measured them: warm or "
        "cold task workers, or none (default: warm)",
    )
    parser.add_argument(
        "--task-fixed-s",
        type=_seconds,
        metavar="S",
        help="seconds every task pays before its download (overrides --fixed-costs)",
    )
    parser.add_argument(
        "--round-fixed-s",
        type=_seconds,
        metavar="S",
        help="seconds every round pays after its last update, before the next round opens "
        "(overrides --fixed-costs)",
    )


def _costs(args: argparse.Namespace) -> FixedCosts:
    preset = FIXED_COSTS[args.fixed_costs]
    overrides = {"task_s": args.task_fixed_s, "round_s": args.round_fixed_s}
    return dataclasses.replace(preset, **{k: v for k, v in overrides.items() if v is not None})


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None, None
    bar = tqdm(total=total, unit="round", file=sys.stderr, dynamic_ncols=True)

    def update(log: RoundLog) -> None:
        bar.set_postfix(acc=f"{log.accuracy:.3f}", sim=f"{log.sim_time_s:.1f}s")
        bar.update(1)

    return bar, update


def _summary(result: SimResult, costs: FixedCosts) -> str:
    target = (
        f"reached {result.target} after {result.rounds_to_target} rounds, "
        f"{result.time_to_target_s:.1f} s simulated"
        if result.reached_target
        else f"target {result.target} not reached"
    )
    return "\n".join(
        [
            f"{result.spec_name}: {result.method} on {result.nodes} nodes, {result.network}",
            f"  final accuracy  {result.final_accuracy:.4f} "
            f"({result.final_correct}/{result.test_total}) after {result.rounds} rounds",
            f"  target          {target}",
            f"  simulated wall  {result.sim_wall_s:.1f} s, compute {result.compute_s:.1f} s "
            f"(utilization {result.utilization:.1%})",
            f"  traffic         {result.bytes_up / 1e6:.2f} MB up, "
            f"{result.bytes_down / 1e6:.2f} MB down",
            f"  fixed costs     {costs.task_s:g} s per task, {costs.round_s:g} s per round",
            f"  provenance head {result.provenance_head or '-'}",
        ]
        + ([f"  stopped         {result.stop_reason}"] if result.stop_reason else [])
    )


def _training(path: Path) -> JobSpec:
    """The simulator trains one spec: a sweep's many trials run through the marketplace."""
    spec = load_spec(path)
    if spec.kind == "sweep":
        raise ValueError(
            f"{path} is a kind: sweep spec; its trials run through the marketplace (gpuflex "
            "submit), or in process with `python -m bench.run --only sweep`"
        )
    return spec


def cmd_run(args: argparse.Namespace) -> int:
    spec = _training(args.spec)
    seed = spec.seed if args.seed is None else args.seed
    setup = prepare(spec, args.nodes, args.network, seed, args.spec.parent, _costs(args))
    bar, progress = _progress_bar(args.rounds or spec.rounds.max_rounds, not args.json)
    if args.method == "naive":
        result, _ = run_naive_sync(setup, max_rounds=args.rounds, progress=progress)
    elif spec.adaptation.enabled:
        if args.checkpoint or args.provenance:
            raise ValueError(
                "--checkpoint and --provenance are not supported for network-aware runs yet"
            )
        result, _ = run_network_aware(setup, RunOptions(max_rounds=args.rounds), progress)
    else:
        options = RunOptions(
            max_rounds=args.rounds,
            checkpoint=args.checkpoint,
            resume=args.resume,
            provenance_dir=args.provenance,
        )
        # rounds.mode naive: one step a round, every node, uncompressed, as the marketplace
        # runs it (trainer.spec fixed the settings)
        method = "naive" if spec.rounds.mode == "naive" else "fedavg"
        result, _ = run_federated(setup, options, progress=progress, method=method)
    if bar is not None:
        bar.close()
    print(json.dumps(result.to_dict()) if args.json else _summary(result, setup.costs))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    spec = _training(args.spec)
    seed = spec.seed if args.seed is None else args.seed
    costs = _costs(args)
    results = compare(
        spec, args.nodes, args.network, seed, args.target, args.spec.parent, costs=costs
    )
    data = summary(results)
    if args.json:
        print(json.dumps(data))
        return 0
    print(
        f"{spec.name}: {args.nodes} nodes, {args.network}; fixed costs "
        f"{costs.task_s:g} s per task, {costs.round_s:g} s per round"
    )
    print(
        f"  {'method':14} {'time to target':>15} {'KB up/node':>11} {'accuracy':>9} "
        f"{'utilization':>12} {'idle':>6}"
    )
    for method in METHODS:
        row = data[method]
        t = row["time_to_target_s"]
        kb = row["bytes_up_per_node_to_target"]
        time_text = f"{t:.1f} s" if t is not None else "not reached"
        kb_text = f"{kb / 1e3:.1f}" if kb is not None else "-"
        print(
            f"  {method:14} {time_text:>15} {kb_text:>11} "
            f"{row['final_accuracy']:>9.4f} {row['utilization']:>12.3f} "
            f"{row['idle_fraction']:>6.3f}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run" and args.resume and not args.checkpoint:
        print("gpuflex-sim: --resume needs --checkpoint", file=sys.stderr)
        return 2
    try:
        return cmd_compare(args) if args.command == "compare" else cmd_run(args)
    except (SpecError, DatasetError, ShardingError, UnknownProfile, ValueError) as exc:
        print(f"gpuflex-sim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
