"""This machine's hardware and benchmark figures, found in a child process.

Detecting a GPU and measuring it imports torch, which then holds some 230 MB for the life of
the process. The agent is a long-lived daemon (and the tray app hosts one) that never trains
itself: its tasks do, in the sandbox's warm worker, which holds torch already. So the agent
runs `python -m desktop.probe` and keeps only the figures; the child's exit also hands a GPU's
CUDA context back.

A machine measured already (the demo measures its one machine once for its five agents)
hands the figures to `gpuflex-node run --measured FILE`: `save_measured` writes the probe's
own JSON, `load_measured` reads it back, checked, and no probe runs at all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from desktop.bench_result import BenchmarkResult
from desktop.entry import entry_argv
from desktop.hardware import GpuInfo, HardwareReport
from desktop.lanes import lane_env, lane_hardware
from desktop.runtime.active import pack_env


class ProbeFailed(RuntimeError):
    pass


class MeasuredFileError(ValueError):
    """A `--measured` file this agent cannot take; the message names the file and why."""


def save_measured(path: Path, hw: HardwareReport, bench: BenchmarkResult) -> None:
    """The figures `probe` found, as the probe's child prints them, for `load_measured`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"hardware": hw.to_dict(), "benchmark": bench.to_dict()}
    path.write_text(json.dumps(body, indent=2), encoding="utf-8")


def load_measured(path: Path) -> tuple[HardwareReport, BenchmarkResult]:
    """(hardware, benchmark) from a file `save_measured` (or `python -m desktop.probe`)
    wrote. The benchmark must be of that hardware (the cache's own rule: its fingerprint), so
    one machine's figures are not advertised for another's GPUs."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MeasuredFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise MeasuredFileError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("hardware"), dict):
        raise MeasuredFileError(f"{path} has no 'hardware' object (write it with "
                                "`python -m desktop.probe CACHE_DIR`)")  # fmt: skip
    if not isinstance(data.get("benchmark"), dict):
        raise MeasuredFileError(f"{path} has no 'benchmark' object (it was written with "
                                "--detect-only?)")  # fmt: skip
    try:
        hw = HardwareReport.from_dict(data["hardware"])
        bench = BenchmarkResult.from_dict(data["benchmark"])
    except (TypeError, ValueError) as exc:
        raise MeasuredFileError(f"{path} does not hold the probe's figures: {exc}") from None
    if bench.fingerprint != hw.fingerprint():
        raise MeasuredFileError(f"{path}: its benchmark was measured on other hardware (or "
                                "another version of this app) than the hardware it names; "
                                "measure again")  # fmt: skip
    return hw, bench


def probe(
    cache_dir: Path,
    quick: bool = True,
    measure: bool = True,
    gpu: GpuInfo | None = None,
    packages: Path | None = None,
) -> tuple[HardwareReport, BenchmarkResult | None, bool]:
    """(hardware, benchmark, from_cache), as `detect()` and `benchmark()` give them; the
    benchmark is None unless `measure`. `gpu`: one lane's GPU (desktop.lanes), measured
    alone, with the report narrowed to it. `packages`: the runtime pack tasks run with
    (desktop/runtime/active.py), so that the figures are that torch's."""
    args = [str(cache_dir), *(["--full"] * (not quick)), *(["--detect-only"] * (not measure))]
    env = None
    if gpu is not None:
        args += ["--gpu", str(gpu.index)]
        env = {**os.environ, **lane_env(gpu)}  # torch in the child sees that GPU only
    if packages is not None:
        env = {**(env or os.environ), **pack_env(packages)}
    done = subprocess.run(entry_argv("desktop.probe", "_probe", *args), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    if done.returncode:
        raise ProbeFailed(f"measuring this machine failed: {done.stderr.strip()[-2000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    bench = data["benchmark"]
    return (
        HardwareReport.from_dict(data["hardware"]),
        None if bench is None else BenchmarkResult.from_dict(bench),
        bool(data["cached"]),
    )


def main(argv: list[str] | None = None) -> int:
    """The child's side: the figures as one JSON line on stdout."""
    parser = argparse.ArgumentParser(prog="desktop.probe")
    parser.add_argument("cache_dir")
    parser.add_argument("--full", action="store_true", help="the full benchmark, not quick")
    parser.add_argument("--detect-only", action="store_true")
    parser.add_argument("--gpu", type=int, help="one lane's GPU (its index), measured alone")
    args = parser.parse_args(argv)
    from desktop.benchmark import benchmark
    from desktop.hardware import detect

    hw = detect()
    if args.gpu is not None:
        hw = lane_hardware(hw, args.gpu)
    result, cached = None, False
    if not args.detect_only:
        result, cached = benchmark(hw, Path(args.cache_dir), quick=not args.full)
    bench = None if result is None else result.to_dict()
    print(json.dumps({"hardware": hw.to_dict(), "benchmark": bench, "cached": cached}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
