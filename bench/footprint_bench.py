"""The server processes' footprint (issue 36): the web process's import time and resident
memory once its URL conf is loaded, `gpuflex manage check`'s peak, and `gpuflex demo`'s wall
time and the summed peak memory of all its processes. And a GPU owner's (issue 32,
`python -m bench.run --only footprint`, `node_section`): an idle registered node's resident
memory, the lean installer's and the `cuda12` runtime pack's download sizes, and the time
from a fresh install to a first task trained.

    python -m bench.footprint_bench            # web process and manage (seconds)
    python -m bench.footprint_bench --demo     # and one `gpuflex demo` run (a minute or two)
    python -m bench.footprint_bench --node     # issue 32's figures only (about a minute)

Prints one JSON object. The process tree is polled every 0.25 s (psutil): `peak_total_mb` is
the largest sum, at one instant, of the proportional set sizes (PSS: a page shared by a
forked task worker and its zygote counts half to each) of every process the command runs,
what the machine must hold (the goal: ≤ 2 GB for the demo); `processes` gives each
process's own resident peak.
"""

from __future__ import annotations

import argparse
import contextlib
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
    proc: subprocess.Popen, timeout_s: float, at_peak: list[tuple[str, float]] | None = None
) -> tuple[float, float, dict[int, tuple[str, float]]]:
    """Wait for `proc`, polling its process tree: (wall seconds, the largest total PSS at one
    instant in MB, pid -> (command, its own resident peak in MB)). `at_peak`, when given,
    is filled with each process's (command, PSS in MB) at that instant: what made the peak."""
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
        now: list[tuple[str, float]] = []
        for p in tree:
            try:
                info = p.memory_full_info()
                name = " ".join(p.cmdline()[1:4]) or p.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            total += getattr(info, "pss", info.rss) / 2**20
            now.append((name, getattr(info, "pss", info.rss) / 2**20))
            rss = info.rss / 2**20
            if rss > peaks.get(p.pid, ("", 0.0))[1]:
                peaks[p.pid] = (name, rss)
        if total > peak_total and at_peak is not None:
            at_peak[:] = now
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
    """One `gpuflex demo --json`: its wall time, the CPU-seconds of all its processes (the
    figure other load on the machine inflates least), the summed peak and what made it, and
    the demo's own `phases_s` (when each start-up step ended)."""
    import resource

    def cpu_s() -> float:  # every descendant waited for: the demo reaps its own processes
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "marketplace.cli", "demo", "--json", "--data-dir",
               f"{tmp}/demo"]  # fmt: skip
        cpu_before = cpu_s()
        at_peak: list[tuple[str, float]] = []
        with open(f"{tmp}/summary.json", "wb") as summary:  # a pipe nobody reads could fill
            proc = subprocess.Popen(cmd, env=_env(), cwd=tmp, stdout=summary,
                                    stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            wall, total, peaks = _peaks(proc, 900, at_peak)
        lines = Path(tmp, "summary.json").read_text().strip().splitlines()
    phases = json.loads(lines[-1]).get("phases_s") if lines else None
    top = sorted(peaks.values(), key=lambda p: -p[1])
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "cpu_s": cpu_s() - cpu_before,
        "load_average": os.getloadavg(),
        "phases_s": phases,
        "peak_total_mb": total,
        "at_peak": [
            {"cmd": n, "pss_mb": round(mb)}
            for n, mb in sorted(at_peak, key=lambda p: -p[1])
            if mb > 20
        ],
        "processes": [{"cmd": name, "peak_mb": round(mb)} for name, mb in top if mb > 20],
    }


# Issue 32's goals, reported beside the measurements
GOAL_IDLE_NODE_MB = 60
GOAL_INSTALLER_MIB = 60
WARM_IDLE_S = 3.0  # the bench's quiet period; the default (300 s) only makes it wait longer
IDLE_SAMPLES = 10


def _tree_memory(pid: int) -> tuple[float, float, list[dict[str, Any]]]:
    """(resident MB, proportional MB, per process) summed over `pid` and its descendants, read
    from /proc (psutil: VmRSS and smaps_rollup's Pss)."""
    root = psutil.Process(pid)
    rss = pss = 0.0
    procs = []
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            name = " ".join(p.cmdline()[1:5]) or p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        rss += info.rss / 2**20
        pss += getattr(info, "pss", info.rss) / 2**20
        procs.append({"cmd": name, "rss_mb": round(info.rss / 2**20, 1)})
    return rss, pss, procs


BUNDLE = ROOT / "dist" / "gpuflex" / "gpuflex-node"


class NodeExited(RuntimeError):
    """The measured agent stopped on its own."""


def idle_node(bundle: bool = False, timeout_s: float = 600.0) -> dict[str, Any]:
    """A real `gpuflex-node run` against the agent API's test double (tests/desktop/
    fake_marketplace.py: the marketplace is not what is measured): it registers, trains one
    small task in its warm worker, and after `warm_idle_s` of quiet the worker stops. Then
    the agent and any children it still has are sampled, IDLE_SAMPLES times a second apart:
    resident (RSS) and proportional (PSS) memory, the medians. With `bundle`, the lean
    bundle `make package` built (dist/gpuflex) instead of the source tree's agent, registered
    with no task at all: it has no task runtime until a runtime pack brings one."""
    import statistics

    sys.path.insert(0, str(ROOT / "tests" / "desktop"))
    from fake_marketplace import PROVIDER_KEY, FakeMarketplace, digits_task

    from desktop.bench_result import BenchmarkResult, save_cached
    from desktop.config import Credentials, Paths, Settings, save_settings
    from desktop.hardware import detect

    def wait(cond: Any, what: str) -> None:
        end = time.monotonic() + timeout_s
        while not cond():
            if node.poll() is not None:
                lines = Path(tmp, "agent.log").read_text(errors="replace").splitlines()
                errors = [line for line in lines if "Error:" in line] or lines or [""]
                raise NodeExited(f"the agent exited ({node.returncode}) before {what}: "
                                 f"{errors[-1].strip()}")  # fmt: skip
            if time.monotonic() > end:
                raise TimeoutError(f"footprint: timed out waiting for {what}")
            time.sleep(0.2)

    with tempfile.TemporaryDirectory() as tmp, FakeMarketplace() as market:
        dirs = {f"GPUFLEX_NODE_{n.upper()}_DIR": f"{tmp}/{n}" for n in ("config", "data", "cache")}
        os.environ.update(dirs)  # Paths.default() reads them, here and in the agent
        paths = Paths.default()
        Credentials(paths).set_provider_key(PROVIDER_KEY)
        save_settings(Settings(server_url=market.url, node_name="footprint", task_wall_s=600,
                               task_memory_mb=4096, first_run_done=True,
                               warm_idle_s=WARM_IDLE_S), paths)  # fmt: skip
        hw = detect()
        save_cached(paths.cache, BenchmarkResult(
            fingerprint=hw.fingerprint(), device="cpu", device_name=hw.cpu_name, quick=True,
            matmul_tflops={"fp32": 0.1}, memory_gbps=5.0, h2d_gbps=None, d2h_gbps=None,
            train_samples_per_s={"mlp": 1000.0}))  # fmt: skip
        if bundle:
            program = [str(BUNDLE)]
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        else:
            market.add(digits_task("t-footprint"))
            program, env = [sys.executable, "-m", "desktop.cli"], _env()
        with open(Path(tmp, "agent.log"), "wb") as log:  # a pipe nobody reads could fill
            node = subprocess.Popen([*program, "run", "--claim-wait", "1"], env=env, cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True)  # fmt: skip
        try:
            if bundle:
                wait(lambda: sum(r[1].endswith("/claim?wait=1") for r in market.requests) >= 3,
                     "the node to poll for work")  # fmt: skip
            else:
                wait(lambda: "t-footprint" in market.accepted(), "the task's upload")
            started = time.monotonic()
            # the warm worker (and any task process) gone: the agent alone, polling for work
            wait(lambda: not psutil.Process(node.pid).children(recursive=True), "the warm "
                 "worker to stop")  # fmt: skip
            stopped_after_s = time.monotonic() - started
            samples = []
            for _ in range(IDLE_SAMPLES):
                samples.append(_tree_memory(node.pid))
                time.sleep(1.0)
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have exited on its own
                os.killpg(node.pid, 15)
            node.wait(timeout=60)
            for name in dirs:
                os.environ.pop(name, None)
    return {
        "rss_mb": statistics.median(s[0] for s in samples),
        "pss_mb": statistics.median(s[1] for s in samples),
        "processes": samples[-1][2],
        "warm_idle_s": WARM_IDLE_S,
        "worker_stopped_after_s": stopped_after_s,
    }


def installer() -> dict[str, Any]:
    """The lean `.deb` `make package` left in dist/ (zstd), in MiB."""
    debs = sorted((ROOT / "dist").glob("gpuflex_*.deb"), key=lambda p: p.stat().st_mtime)
    if not debs:
        return {"mib": None, "why": "no .deb in dist/: `make package` has not been run here"}
    deb = debs[-1]
    return {"mib": deb.stat().st_size / 2**20, "path": str(deb.relative_to(ROOT))}


def cuda12_pack(path: str | None) -> dict[str, Any]:
    """The `cuda12` runtime pack's download size, from its archive (a path given by
    --cuda12-pack or GPUFLEX_CUDA12_PACK; scripts/build-runtime-pack.sh cuda12 builds it).
    The pack's manifest beside it says what it holds: a pack of another plan class (PyPI's
    own CUDA torch builds as `cuda13`) is reported with a note saying so."""
    path = path or os.environ.get("GPUFLEX_CUDA12_PACK")
    if not path:
        return {"mib": None, "why": "no cuda12 pack given (--cuda12-pack or GPUFLEX_CUDA12_PACK; "
                "scripts/build-runtime-pack.sh cuda12 builds one)"}  # fmt: skip
    pack = Path(path)
    if not pack.is_file():
        return {"mib": None, "why": f"{pack} is not a file"}
    found: dict[str, Any] = {"mib": pack.stat().st_size / 2**20, "path": str(pack)}
    manifest = pack.with_suffix("").with_suffix(".json")
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        found.update({k: m.get(k) for k in ("plan", "torch", "cuda", "min_driver")})
        if m.get("plan") != "cuda12":
            found["note"] = (
                f"this is the {m.get('plan')} pack (torch {m.get('torch')}, CUDA "
                f"{m.get('cuda')}): PyPI's torch wheel, the CUDA pack buildable here; a true "
                "cuda12 pack needs PyTorch's cu12x index (RUNTIME_INDEX_URL), not reachable here"
            )
    return found


def install_to_first_task() -> dict[str, Any]:
    """Fresh install to first task trained: the lean .deb (dist/) installed into a root with
    an empty dpkg database, the `cpu` pack (dist/runtime/) fetched by the installed
    `gpuflex-node runtime fetch` from a TUF repository served over loopback, and one digits
    task of the agent API's test double trained and uploaded by the installed agent (its
    first start: the hardware probe and benchmark with the pack's torch). The same steps as
    tests/desktop/test_deb_runtime.py (tests/desktop/fresh_install.py). The goal: 60 s plus
    the pack's download at 100 MB/s (loopback here is faster than that)."""
    import shutil

    sys.path.insert(0, str(ROOT / "tests" / "desktop"))
    import fresh_install

    deb, pack = fresh_install.built_deb(), fresh_install.built_cpu_pack()
    if not (deb and pack):
        return {"s": None, "why": "needs dist/gpuflex_*.deb and dist/runtime/cpu-*.tar.gz "
                "(make package)"}  # fmt: skip
    if not shutil.which("dpkg"):
        return {"s": None, "why": "needs dpkg (Debian)"}
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with fresh_install.fresh_node(deb, pack, Path(tmp)) as node:
                timings = dict(node.timings)
        except RuntimeError as exc:
            return {"s": None, "why": str(exc)[-1000:]}
        finally:
            os.chdir(here)
    return {
        "s": timings["install_to_first_task_s"],
        **timings,
        "pack_mib": pack.stat().st_size / 2**20,
        "pack": str(pack.relative_to(ROOT)),
        "deb": str(deb.relative_to(ROOT)),
        "goal_s": fresh_install.goal_s(pack),
    }


def node_section(cuda12_pack_path: str | None = None) -> dict[str, Any]:
    """Issue 32's figures, under `footprint` in bench/results/results.json."""
    node, deb, pack = idle_node(), installer(), cuda12_pack(cuda12_pack_path)
    first = install_to_first_task()
    frozen: dict[str, Any] = {"rss_mb": None, "why": "no bundle in dist/ (make package)"}
    if BUNDLE.exists():
        try:
            frozen = idle_node(bundle=True)
        except NodeExited as exc:  # e.g. no task runtime to probe the machine with
            frozen = {"rss_mb": None, "why": str(exc)}
    return {
        "idle_node_rss_mb": node["rss_mb"],
        "idle_node": node,
        "idle_bundle_node": frozen,
        "idle_node_goal_mb": GOAL_IDLE_NODE_MB,
        "installer_mib": deb["mib"],
        "installer": deb,
        "installer_goal_mib": GOAL_INSTALLER_MIB,
        "cuda12_pack_mib": pack["mib"],
        "cuda12_pack": pack,
        "install_to_first_task_s": first["s"],
        "install_to_first_task": first,
    }


def render_node(f: dict[str, Any]) -> list[str]:
    def fig(value: float | None, unit: str, why: dict[str, Any]) -> str:
        return f"{value:.1f} {unit}" if value is not None else f"— ({why.get('why', '')})"

    node, frozen = f["idle_node"], f.get("idle_bundle_node") or {"why": "not measured"}
    first = f["install_to_first_task"]
    goal = "≤ 60 s plus the download at 100 MB/s"
    if first.get("goal_s"):
        goal += f" = {first['goal_s']:.1f} s for the {first['pack_mib']:.0f} MiB cpu pack"
    notes = []
    if first.get("s") is not None:
        notes += [
            f"Fresh install (`{first['deb']}` into an empty dpkg root, "
            f"`gpuflex-node runtime fetch` of `{first['pack']}` from a TUF repository on "
            f"loopback, the installed agent's first start and one digits task): dpkg "
            f"{first['install_s']:.1f} s, fetch {first['fetch_s']:.1f} s (download, TUF checks, "
            f"unpack, hashing), first task {first['first_task_s']:.1f} s (probe, benchmark, "
            "training, upload).",
            "",
        ]
    if f["cuda12_pack"].get("note"):
        notes += [f"`cuda12_pack_mib`: {f['cuda12_pack']['note']}.", ""]
    return [
        "## A GPU owner's footprint (issue 32)",
        "",
        "`python -m bench.run --only footprint`: a real `gpuflex-node run` registers with the "
        "agent API's test double, trains one small task, and once `warm_idle_s` "
        f"({node['warm_idle_s']:.0f} s here) has stopped its warm worker, the agent and any "
        f"children are sampled {IDLE_SAMPLES} times (median; /proc RSS and PSS).",
        "",
        "| figure | measured | goal |",
        "|---|---:|---|",
        f"| registered node with no work, resident (agent + children) | "
        f"{f['idle_node_rss_mb']:.1f} MB (PSS {node['pss_mb']:.1f} MB, "
        f"{len(node['processes'])} process(es)) | ≤ {f['idle_node_goal_mb']} MB |",
        f"| the same, the lean bundle's `gpuflex-node` (registered, no task yet) | "
        f"{fig(frozen.get('rss_mb'), 'MB', frozen)} | ≤ {f['idle_node_goal_mb']} MB |",
        f"| installer download (`.deb`, zstd) | "
        f"{fig(f['installer_mib'], 'MiB', f['installer'])} | ≤ {f['installer_goal_mib']} MiB |",
        f"| `cuda12` pack | {fig(f['cuda12_pack_mib'], 'MiB', f['cuda12_pack'])} | built; "
        "its size reported |",
        f"| fresh install to first task trained | "
        f"{fig(f['install_to_first_task_s'], 's', first)} | {goal} |",
        "",
        *notes,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.footprint_bench")
    parser.add_argument("--demo", action="store_true", help="also time one `gpuflex demo`")
    parser.add_argument("--node", action="store_true", help="issue 32's figures only")
    parser.add_argument("--cuda12-pack", help="the cuda12 runtime pack's archive, to size it")
    args = parser.parse_args(argv)
    if args.node:
        print(json.dumps(node_section(args.cuda12_pack), indent=2))
        return 0
    result: dict[str, Any] = {"web": web_process(), "manage_check": manage_check()}
    if args.demo:
        result["demo"] = demo()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
