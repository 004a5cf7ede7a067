"""Fault injection for robustness tests and the bench, never offered to contributors:

    python -m desktop.fault_injection --byzantine MODE [--byzantine-scale X] \\
        [gpuflex-node run's options]

runs `gpuflex-node run` as a Byzantine node: every update it sends is corrupted by the sandboxed
task runner (desktop/task_runner.py BYZANTINE_ENV). MODE: sign_flip and noise attack the job;
the lazy cheats (issue 35) try to be paid for work not done: half_steps, wrong_shard,
precision_claim and scaled train otherwise than asked, copy and stale train nothing and send
an update this node made earlier (desktop/cheat_sources.py keeps them and hands one to the next
task: another shard's for copy, the same shard's from an earlier round for stale).

It is no console script and no option of `gpuflex-node run`, so a contributor's `--help`
offers no way to attack the jobs it works on; the test clusters (marketplace/demo/cluster.py),
tests/system/test_fault_byzantine.py and tests/system/test_segment_checks.py start agents
through it.
"""

from __future__ import annotations

import argparse
import sys

from desktop.task_runner import BYZANTINE_SCALES  # no torch at import: cheap


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m desktop.fault_injection",
        description="FAULT INJECTION (robustness tests only): `gpuflex-node run` as a node that "
        "attacks every job it works on; other options go to `gpuflex-node run`",
    )
    p.add_argument(
        "--byzantine",
        required=True,
        choices=tuple(BYZANTINE_SCALES),
        help="sign_flip: -scale x its real update; noise: its update plus Gaussian noise of "
        "scale x its norm; scaled: scale x its update; half_steps: trains scale x the steps; "
        "wrong_shard: trains on half its shard; precision_claim: trains fp16, claims fp32; "
        "copy/stale: sends an earlier update of another shard/the same shard",
    )
    p.add_argument(
        "--byzantine-scale",
        type=float,
        help="how hard it attacks (default: "
        + ", ".join(f"{v:g} for {k}" for k, v in BYZANTINE_SCALES.items())
        + ")",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from desktop.cli import build_parser

    args, rest = parser().parse_known_args(argv)
    if args.byzantine_scale is not None and not args.byzantine_scale > 0:
        print("--byzantine-scale must be positive", file=sys.stderr)
        return 2
    scale = args.byzantine_scale or BYZANTINE_SCALES[args.byzantine]
    run = build_parser().parse_args(["run", *rest])
    # kept out of the saved settings (cmd_run adds them to this run's only): only this run attacks
    run.faults = {"byzantine": f"{args.byzantine}:{scale}"}
    return int(run.fn(run) or 0)


if __name__ == "__main__":
    sys.exit(main())
