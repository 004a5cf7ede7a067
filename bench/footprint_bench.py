"""The server processes' footprint (issue 36): the web process's import time and resident
memory once its URL conf is loaded, `gpuflex manage check`'s peak, and `gpuflex demo`'s wall
time and the summed peak memory of all its processes.

    python -m bench.footprint_bench            # web process and manage (seconds)
    python -m bench.footprint_bench --demo     # and one `gpuflex demo` run (a minute or two)

Prints one JSON object. The process tree is polled every 0.25 s (psutil): `peak_total_mb` is
the largest sum, at one instant, of the proportional set sizes (PSS: a page shared by a
forked task worker and its zygote counts half to each) of every process the command runs,
what the machine must hold (the goal: ≤ 2 GB for the demo); `processes` gives each
process's own resident peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "transformers", "tokenizers", "safetensors", "scipy", "PIL", "optuna")
_WEB = """
import json, os, sys, time
started = time.perf_counter()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")
import marketplace.server.wsgi  # the app, and every view through its URL conf
import_s = time.perf_counter() - started
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
print(json.dumps({"import_s": import_s, "rss_mb": rss / 1024, "heavy_loaded": loaded}))
"""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def web_process(repeats: int = 3) -> dict[str, Any]:
    """The best of `repeats` fresh interpreters (the least disturbed by other load)."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _WEB, *HEAVY], capture_output=True,
                             text=True, check=True, env=_env(), cwd=ROOT)  # fmt: skip
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["import_s"])
    return {**best, "rss_mb": min(r["rss_mb"] for r in runs)}


def _peaks(
    proc: subprocess.Popen, timeout_s: float
) -> tuple[float, float, dict[int, tuple[str, float]]]:
    """Wait for `proc`, polling its process tree: (wall seconds, the largest total PSS at one
    instant in MB, pid -> (command, its own resident peak in MB))."""
    root = psutil.Process(proc.pid)
    peaks: dict[int, tuple[str, float]] = {}
    peak_total = 0.0
    started = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - started > timeout_s:
            proc.kill()
            break
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        total = 0.0
        for p in tree:
            try:
                info = p.memory_full_info()
                name = " ".join(p.cmdline()[1:4]) or p.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            total += getattr(info, "pss", info.rss) / 2**20
            rss = info.rss / 2**20
            if rss > peaks.get(p.pid, ("", 0.0))[1]:
                peaks[p.pid] = (name, rss)
        peak_total = max(peak_total, total)
        time.sleep(0.25)
    proc.wait()
    return time.monotonic() - started, peak_total, peaks


def manage_check() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data:
        cmd = [sys.executable, "-m", "marketplace.cli", "manage", "check"]
        proc = subprocess.Popen(cmd, env=_env() | {"GPUFLEX_DATA_DIR": data}, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        wall, total, _ = _peaks(proc, 300)
    return {"wall_s": wall, "peak_total_mb": total}


def demo() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "marketplace.cli", "demo", "--data-dir", f"{tmp}/demo"]
        proc = subprocess.Popen(cmd, env=_env(), cwd=tmp, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        wall, total, peaks = _peaks(proc, 900)
    top = sorted(peaks.values(), key=lambda p: -p[1])
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "peak_total_mb": total,
        "processes": [{"cmd": name, "peak_mb": round(mb)} for name, mb in top if mb > 20],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.footprint_bench")
    parser.add_argument("--demo", action="store_true", help="also time one `gpuflex demo`")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"web": web_process(), "manage_check": manage_check()}
    if args.demo:
        result["demo"] = demo()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
