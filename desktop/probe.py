"""This machine's hardware and benchmark figures, found in a child process.

Detecting a GPU and measuring it imports torch, which then holds some 230 MB for the life of
the process. The agent is a long-lived daemon (and the tray app hosts one) that never trains
itself: its tasks do, in the sandbox's warm worker, which holds torch already. So the agent
runs `python -m desktop.probe` and keeps only the figures; the child's exit also hands a GPU's
CUDA context back.
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
