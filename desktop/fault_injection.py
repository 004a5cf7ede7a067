"""Fault injection for robustness tests and the bench, never offered to contributors:

    python -m desktop.fault_injection --byzantine sign_flip|noise [--byzantine-scale X] \\
        [gpuflex-node run's options]

runs `gpuflex-node run` as a Byzantine node: every update it sends is corrupted by the sandboxed
task runner (desktop/task_runner.py BYZANTINE_ENV). It is no console script and no option of
`gpuflex-node run`, so a contributor's `--help` offers no way to attack the jobs it works on;
the test clusters (marketplace/demo/cluster.py) and tests/system/test_fault_byzantine.py start
agents through it.
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
        "scale x its norm",
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
