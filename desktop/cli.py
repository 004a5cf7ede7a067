"""`gpuflex-node`: the contributor agent from a terminal (and from systemd on servers)."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import signal
import sys
import time
from typing import Any

from desktop import __version__, runtime_cli


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_info(args: argparse.Namespace) -> int:
    from desktop.hardware import detect
    from desktop.sandbox import isolation

    hw = detect()
    level, how = isolation()
    if args.json:
        sandbox = {"sandbox": level == "full", "isolation": level, "isolation_detail": how}
        _print_json({**hw.to_dict(), "fingerprint": hw.fingerprint(), **sandbox})
    else:
        print(hw.summary())
        print(f"sandbox {how}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from desktop.bench_result import load_cached
    from desktop.benchmark import benchmark
    from desktop.config import Paths
    from desktop.hardware import detect

    hw = detect()
    cache = Paths.default().cache
    # the cache first: a cached result is shown as what it is, never as "benchmarking…"
    result = None if args.force else load_cached(cache, hw, args.quick)
    cached = result is not None
    if result is None:
        if not args.json:
            print(f"benchmarking {hw.primary_gpu.name if hw.primary_gpu else hw.cpu_name}…",
                  file=sys.stderr)  # fmt: skip
        result, _ = benchmark(hw, cache, quick=args.quick, force=True)
    if args.json:
        _print_json({**result.to_dict(), "cached": cached})
    elif cached:
        print(f"the cached result for this hardware, measured {_when(result.created)} "
              "(--force to measure again)", file=sys.stderr)  # fmt: skip
        print(result.summary())
    else:
        print(result.summary())
        print(f"took {result.duration_s:.1f} s")
    return 0


def _when(epoch_s: float) -> str:
    """ "2026-11-28 12:40 (3 h ago)": when a cached figure was measured, in local time."""
    ago = max(0.0, time.time() - epoch_s)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if ago >= size:
            span = f"{ago / size:.0f} {unit} ago"
            break
    else:
        span = "just now"
    return f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(epoch_s))} ({span})"


def cmd_login(args: argparse.Namespace) -> int:
    """Through the running agent when there is one, else the same code here (config.sign_in)."""
    from desktop.config import InvalidSettings, apply_changes, load_settings, sign_in
    from desktop.control import ControlClient, ControlError

    changes = {k: v for k, v in (("server_url", args.server), ("price_per_gpu_hour", args.price),
                                 ("node_name", args.name)) if v}  # fmt: skip
    if args.platform_token:  # an operator enrolls this machine as a platform node
        changes |= {"kind": "platform", "enrollment_token": args.platform_token}
    key = args.key or getpass.getpass("Provider API key (gfx_u_…): ")
    client = ControlClient()
    try:
        if client.running():
            if changes:
                client.update_settings(changes)
            backend = client.login(key)["backend"]
            print(f"saved for the running agent (pid {client.status()['pid']}) in the {backend}")
            return 0
        settings = apply_changes(load_settings(), changes)
        creds = sign_in(key, settings)
    except (InvalidSettings, ControlError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"saved for {settings.server_url} in the {creds.backend}")
    return 0


class _RequestsAtDebug(logging.Filter):
    """httpx logs every request at INFO: a heartbeat every few seconds, a claim each poll,
    burying what the agent says about its work. They are routine, so DEBUG: shown only when
    the log is at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def quiet_routine_requests() -> None:
    """The HTTP client's request lines (heartbeats, claims, uploads) at DEBUG, once."""
    httpx_log = logging.getLogger("httpx")
    if not any(isinstance(f, _RequestsAtDebug) for f in httpx_log.filters):
        httpx_log.addFilter(_RequestsAtDebug())


def cmd_run(args: argparse.Namespace) -> int:
    from desktop.agent import Agent
    from desktop.config import load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    quiet_routine_requests()
    settings = load_settings()
    if args.server:
        settings.server_url = args.server
    if args.network_profile is not None:
        from trainer.sim.network import UnknownProfile, get_profile

        try:
            get_profile(args.network_profile)
        except UnknownProfile as exc:
            print(exc, file=sys.stderr)
            return 2
        settings.network_profile = args.network_profile
    if args.compute_scale is not None:
        if not args.compute_scale >= 1.0:
            print("--compute-scale must be at least 1 (1: this machine's speed)", file=sys.stderr)
            return 2
        settings.extra["compute_scale"] = args.compute_scale
    for name in ("zone", "zone_listen", "zone_url"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    # fault injection, set only by desktop/fault_injection.py (tests, bench), never an option
    # here; kept out of the saved settings: only this run attacks
    settings.extra.update(getattr(args, "faults", {}))
    from desktop.config import Paths
    from desktop.daemon import Daemon
    from desktop.service_lock import AlreadyRunning

    hw = bench = None
    if args.measured is not None:  # figures measured already: no probe (no torch) at start
        from pathlib import Path

        from desktop.lanes import plan_lanes
        from desktop.probe import MeasuredFileError, load_measured

        try:
            hw, bench = load_measured(Path(args.measured))
        except MeasuredFileError as exc:
            print(f"--measured: {exc}", file=sys.stderr)
            return 2
        if plan_lanes(hw, settings.excluded_gpus) is not None:  # one figure for every GPU
            print(f"--measured: {args.measured} names {len(hw.gpus)} GPUs; a machine that "
                  "works one GPU per lane measures each GPU itself (run without --measured)",
                  file=sys.stderr)  # fmt: skip
            return 2
    paths = Paths.default()
    try:
        daemon = Daemon.open(paths, lambda: Agent(settings, paths, hardware=hw, bench=bench,
                                                  claim_wait_s=args.claim_wait))  # fmt: skip
    except AlreadyRunning as exc:
        who = f"pid {exc.pid}" if exc.pid else "another process"
        print(f"gpuflex-node is already running for {paths.data} ({who}); "
              "see 'gpuflex-node status', or stop it with 'gpuflex-node stop'",
              file=sys.stderr)  # fmt: skip
        return 1

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # run_forever stops gracefully

    signal.signal(signal.SIGTERM, on_term)
    daemon.run_forever()
    return 0


def _local_status() -> dict[str, Any]:
    """The running agent's status through its API; else what the last one left behind."""
    from desktop.config import Paths
    from desktop.control import ControlClient, ControlError, NotRunning

    paths = Paths.default()
    try:
        return ControlClient(paths).status()
    except (NotRunning, ControlError):
        pass
    try:
        local = json.loads((paths.data / "status.json").read_text(encoding="utf-8"))
        lanes = [{**lane, "state": "stopped", "reason": "", "task": None}
                 for lane in local.get("lanes") or []]  # fmt: skip
        return {**local, "state": "stopped", "reason": "", "task": None, "pid": None,
                "lanes": lanes}  # fmt: skip
    except (OSError, ValueError):
        return {"state": "stopped", "note": "no agent has run here yet", "pid": None}


def cmd_status(args: argparse.Namespace) -> int:
    from desktop.agent import LaneStatus
    from desktop.config import Credentials, Paths, load_settings
    from desktop.money import credits

    paths = Paths.default()
    settings = load_settings(paths)
    local = _local_status()
    remote: dict[str, Any] | None = None
    key = Credentials(paths).node_key(settings.server_url)
    if key:
        from desktop.client import ApiError, Backoff, MarketplaceClient

        client = MarketplaceClient(settings.server_url, key, backoff=Backoff(attempts=2),
                                   timeout_s=10)  # fmt: skip
        try:
            remote = client.me()
        except ApiError as exc:
            remote = {"error": str(exc)}
        finally:
            client.close()
    if args.json:
        _print_json({"agent": local, "marketplace": remote})
        return 0
    task = local.get("task")
    pid = f" (pid {local['pid']})" if local.get("pid") else ""
    reason = f": {local['reason']}" if local.get("reason") else ""
    print(f"agent     {local.get('state')}{reason}{pid}")
    print(f"server    {settings.server_url}" + ("" if key else " (not registered)"))
    if task and not local.get("lanes"):
        print(f"task      {task['id']} {task['phase']} {100 * task['progress']:.0f}%")
    for lane in local.get("lanes") or []:  # a multi-GPU machine: each GPU, what it does
        print(f"gpu {lane['gpu']}     {LaneStatus.from_dict(lane).doing()}"
              + (f" (node {lane['node_id']})" if lane.get("node_id") else ""))  # fmt: skip
    print(f"done      {local.get('completed', 0)} ok, {local.get('failed', 0)} failed (this run)")
    if not local.get("lanes"):
        for gpu in (local.get("hardware") or {}).get("gpus", []):
            print(f"gpu {gpu.get('index')}     {gpu.get('name')}")
    e = (remote or {}).get("earnings") or local.get("earnings")  # the agent's last figures
    if e:
        print(f"earnings  today {credits(e.get('today'))}, total {credits(e.get('total'))}")
    if remote and "error" in remote:
        print(f"marketplace: {remote.get('error')}")
    return 0


def _control(fn: Any) -> int:
    """Runs fn(client) against the running agent; a clear line and 1 when none runs."""
    from desktop.control import ControlClient, ControlError, NotRunning

    try:
        return int(fn(ControlClient()) or 0)
    except NotRunning as exc:
        print(f"{exc}; start it with 'gpuflex-node run' (or the tray app)", file=sys.stderr)
        return 1
    except ControlError as exc:
        print(f"the agent refused: {exc}", file=sys.stderr)
        return 2


def cmd_pause(args: argparse.Namespace) -> int:
    def pause(c: Any) -> None:
        print(f"agent {c.pause(args.reason)['reason']}")

    return _control(pause)


def cmd_resume(args: argparse.Namespace) -> int:
    return _control(lambda c: print(f"agent {c.resume()['state']}"))


def cmd_stop(args: argparse.Namespace) -> int:
    return _control(lambda c: print(f"stopping the agent (pid {c.stop()['pid']})"))


def cmd_logs(args: argparse.Namespace) -> int:
    def logs(c: Any) -> None:
        from desktop.agent import LogEntry

        for line in c.logs(args.n):
            entry = LogEntry.from_dict(line)
            print(f"{entry} [{entry.level}]" if entry.level != "info" else entry)

    return _control(logs)


def cmd_tasks(args: argparse.Namespace) -> int:
    def tasks(c: Any) -> None:
        rows = c.tasks(args.n)
        if args.json:
            print(json.dumps(rows, indent=2))
            return
        if not rows:
            print("no tasks yet")
        for row in rows:
            print(task_line(row))

    return _control(tasks)


# what an upload answered 202 is shown as while and after the worker checks it
_CHECKS = {"checking": "being checked", "accepted": "accepted", "unknown": "check unknown"}


def task_line(row: dict[str, Any]) -> str:
    """One task of `gpuflex-node tasks`: when, which, and what became of it."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.get("updated") or 0))
    gpu = f"GPU {row['gpu']}: " if row.get("gpu") is not None else ""
    what = row.get("outcome") or row.get("state") or "?"
    if row.get("check") in _CHECKS:
        what += f" ({_CHECKS[row['check']]})"
    if row.get("refusal"):
        what += f": {row['refusal']}"
    which = f"task {row.get('id')}, job {row.get('job_id')} round {row.get('round')}"
    return f"{when}  {gpu}{which}  {what}"


def cmd_settings(args: argparse.Namespace) -> int:
    def settings(c: Any) -> None:
        changes: dict[str, Any] = {}
        for pair in args.set or []:
            name, sep, value = pair.partition("=")
            if not sep:
                raise SystemExit(f"--set takes NAME=VALUE, not {pair!r}")
            try:
                changes[name] = json.loads(value)  # numbers and true/false as JSON
            except ValueError:
                changes[name] = value  # anything else: a string
        _print_json(c.update_settings(changes) if changes else c.settings())

    return _control(settings)


def cmd_datasets(args: argparse.Namespace) -> int:
    """Local datasets (federated silos): through the running agent when there is one, which
    advertises the change at once; else in the saved settings, advertised at its next start."""
    from desktop import local_datasets as ld
    from desktop.config import load_settings, save_settings
    from desktop.control import ControlClient, ControlError, NotRunning

    client = ControlClient()
    running = client.running()
    try:
        if args.action == "add":
            options = {"kind": args.kind, "label_column": args.label_column,
                       "image_size": args.image_size}  # fmt: skip
            if running:
                found = ld.LocalDataset.from_dict(client.add_dataset(args.name, args.path,
                                                                     **options))  # fmt: skip
            else:
                settings = load_settings()
                found = ld.add(settings, args.name, args.path, **options)
                save_settings(settings)
            print(f"declared {found.name!r}: {_described(found)}")
            if not running:
                print("the agent advertises it when it starts ('gpuflex-node run')")
        elif args.action == "remove":
            if running:
                client.remove_dataset(args.name)
            else:
                settings = load_settings()
                ld.remove(settings, args.name)
                save_settings(settings)
            print(f"removed {args.name!r} (its file is left as it was)")
        else:
            rows = client.datasets() if running else load_settings().local_datasets
            found_all = [ld.LocalDataset.from_dict(d) for d in rows]
            if args.json:
                _print_json([d.to_dict() for d in found_all])
            elif not found_all:
                print("no local datasets declared ('gpuflex-node datasets add NAME PATH')")
            for d in found_all if not args.json else []:
                print(f"{d.name}\t{_described(d)}\t{d.path}")
    except (ld.DatasetRefused, ControlError) as exc:
        print(f"gpuflex-node datasets {args.action}: {exc}", file=sys.stderr)
        return 2
    except NotRunning as exc:
        print(f"the agent stopped answering: {exc}", file=sys.stderr)
        return 1
    return 0


def _described(d: Any) -> str:
    shape = "x".join(str(n) for n in d.input_shape)
    return (f"{d.kind}, {d.rows} rows of {shape}, {d.num_classes} classes, "
            f"sha256 {d.content_hash[:12]}…")  # fmt: skip


def cmd_dataset_child(args: argparse.Namespace) -> int:
    from desktop.local_datasets import main as read_dataset

    return read_dataset([args.request])


def cmd_service(args: argparse.Namespace) -> int:
    from desktop import service_units

    if args.action == "install":
        try:
            print(f"installed {service_units.install(start=args.start)}")
        except OSError as exc:
            print(exc, file=sys.stderr)
            return 1
    elif args.action == "uninstall":
        service_units.uninstall()
        print("removed")
    else:
        from desktop.entry import node_command

        if sys.platform.startswith("linux"):
            print(service_units.systemd_unit(node_command()), end="")
        elif sys.platform == "darwin":
            from desktop.config import Paths

            log_file = Paths.default().data / "agent.log"
            print(service_units.launch_agent(node_command(), log_file).decode(), end="")
        else:
            print(service_units.windows_run_value(node_command()))
    return 0


def cmd_zygote(args: argparse.Namespace) -> int:
    from desktop.runtime.active import put_first_on_path

    put_first_on_path()  # the runtime pack's torch, before anything imports one
    from desktop.task_zygote import main as run_zygote

    return run_zygote()


def cmd_probe(args: argparse.Namespace) -> int:
    from desktop.runtime.active import put_first_on_path

    put_first_on_path()
    from desktop.probe import main as run_probe

    return run_probe(args.rest)


def cmd_update(args: argparse.Namespace) -> int:
    from pathlib import Path

    from desktop import updater
    from desktop.config import Paths

    try:
        install_dir = Path(args.install_dir).resolve() if args.install_dir else None
        install_dir = install_dir or updater.running_bundle_dir()
        source = updater.source_for(install_dir, Paths.default().cache / "update", args.url)
        current = updater.installed_version(install_dir)
        if not args.apply:
            newest = updater.check(source)
            print(
                f"update available: {current} -> {newest}" if newest else f"up to date ({current})"
            )
            return 0
        newest = updater.apply(source)
    except updater.UpdateError as exc:
        print(f"gpuflex-node update: {exc}", file=sys.stderr)
        return 1
    if newest:
        print(f"updated {current} -> {newest}: restart gpuflex-node and gpuflex-tray to run it")
    else:
        print(f"up to date ({current})")
    return 0


def cmd_task(args: argparse.Namespace) -> int:
    from desktop.runtime.active import put_first_on_path

    put_first_on_path()
    from desktop.task_runner import main as run_task

    return run_task([args.folder])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuflex-node", description="GPUFlex contributor agent")
    p.add_argument("--version", action="version", version=f"gpuflex-node {__version__}")
    commands = (
        "info,bench,login,run,status,pause,resume,stop,logs,tasks,settings,datasets,service,"
        "update,runtime"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + commands + "}")

    s = sub.add_parser("info", help="detected hardware")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_info)

    s = sub.add_parser("bench", help="measure this machine (cached per hardware and driver)")
    s.add_argument("--quick", action="store_true", help="small sizes, about a second")
    s.add_argument("--json", action="store_true")
    s.add_argument("--force", action="store_true", help="ignore the cache")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("login", help="store your provider API key")
    s.add_argument("--key", help="the key (default: prompt without echo)")
    s.add_argument("--server", help="marketplace URL")
    s.add_argument("--price", help="price per GPU hour, e.g. 0.40")
    s.add_argument("--name", help="this node's name")
    s.add_argument(
        "--platform-token", help="an operator's enrollment token: register as a platform node"
    )
    s.set_defaults(fn=cmd_login)

    s = sub.add_parser("run", help="the agent: the background service, in the foreground")
    s.add_argument("--server", help="marketplace URL (default: from settings)")
    s.add_argument(
        "--network-profile",
        help="simulate a network: the trainer simulator's profiles (lan, wan, flaky, hetero)",
    )
    s.add_argument(
        "--compute-scale",
        type=float,
        help="simulate a GPU this many times slower than this machine (demos and tests)",
    )
    s.add_argument(
        "--zone",
        help="the region this node is in, sent when it registers: jobs with "
        "aggregation.hierarchy zones send its updates through the zone's aggregator",
    )
    s.add_argument(
        "--zone-listen",
        metavar="HOST:PORT",
        help="platform nodes: serve as the zone's aggregator on this address",
    )
    s.add_argument(
        "--zone-url", help="the address members reach --zone-listen at (default http://HOST:PORT)"
    )
    s.add_argument(
        "--measured",
        metavar="FILE",
        help="this machine's hardware and benchmark, measured already (the JSON "
        "`python -m desktop.probe CACHE_DIR` prints): the agent starts without probing",
    )
    s.add_argument("--claim-wait", type=int, default=20, help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("status", help="what the agent is doing, and earnings")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("pause", help="pause the running agent's work")
    s.add_argument("--reason", default="", help="shown in the tray and to buyers")
    s.set_defaults(fn=cmd_pause)
    s = sub.add_parser("resume", help="resume the running agent's work")
    s.set_defaults(fn=cmd_resume)
    s = sub.add_parser("stop", help="stop the running agent (its task is kept for later)")
    s.set_defaults(fn=cmd_stop)
    s = sub.add_parser("logs", help="the running agent's recent log lines")
    s.add_argument("-n", type=int, default=50, help="how many (at most 500)")
    s.set_defaults(fn=cmd_logs)
    s = sub.add_parser("tasks", help="the tasks taken last, and what became of each")
    s.add_argument("-n", type=int, default=20, help="how many (at most 200)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_tasks)
    s = sub.add_parser("settings", help="show or change the running agent's settings")
    s.add_argument("--set", action="append", metavar="NAME=VALUE")
    s.set_defaults(fn=cmd_settings)
    s = sub.add_parser("datasets", help="local datasets federated jobs train on (never uploaded)")
    acts = s.add_subparsers(dest="action", required=True, metavar="{add,list,remove}")
    a = acts.add_parser("add", help="declare a local dataset: read, checked and advertised "
                        "(its name, schema, row count and hash; never its rows)")  # fmt: skip
    a.add_argument("name", help="the name federated jobs ask for ('gpuflex submit --federated')")
    a.add_argument("path", help="a .csv, .npz or .parquet file, or an image folder")
    a.add_argument("--kind", choices=("csv", "npz", "parquet", "image_folder"),
                   help="the format (default: from the name)")  # fmt: skip
    a.add_argument("--label-column", default="label", help="the label column (tables, npz)")
    a.add_argument("--image-size", type=int, default=28, help="image folders: side in pixels")
    a.set_defaults(fn=cmd_datasets)
    a = acts.add_parser("list", help="the declared local datasets")
    a.add_argument("--json", action="store_true")
    a.set_defaults(fn=cmd_datasets)
    a = acts.add_parser("remove", help="forget a local dataset (its file is left alone)")
    a.add_argument("name")
    a.set_defaults(fn=cmd_datasets)
    s = sub.add_parser("service", help="the per-user background service (systemd, launchd)")
    s.add_argument("action", choices=("show", "install", "uninstall"))
    s.add_argument("--start", action="store_true", help="with install: enable and start now")
    s.set_defaults(fn=cmd_service)
    s = sub.add_parser("update", help="check for (or --apply) a signed update of this bundle")
    s.add_argument("--apply", action="store_true", help="download, verify and install it")
    s.add_argument("--url", help="the update repository (default: $GPUFLEX_UPDATE_URL, or the "
                   "bundle's update/url.txt)")  # fmt: skip
    s.add_argument("--install-dir", help="the bundle folder (default: the running bundle's)")
    s.set_defaults(fn=cmd_update)
    runtime_cli.add_parser(sub)  # training-runtime packs (desktop/runtime_cli.py)

    # what the sandbox runs inside a PyInstaller bundle (no `python -m` there)
    s = sub.add_parser("_zygote")  # the warm task worker, in a frozen app (desktop/warm.py)
    s.add_argument("folder")
    s.set_defaults(fn=cmd_zygote)
    s = sub.add_parser("_task")
    s.add_argument("folder")
    s.set_defaults(fn=cmd_task)
    s = sub.add_parser("_dataset")  # reads a local dataset (desktop/local_datasets.py)
    s.add_argument("request")
    s.set_defaults(fn=cmd_dataset_child)
    s = sub.add_parser("_probe", add_help=False)  # hardware and benchmark (desktop/probe.py)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    from desktop.config import CredentialsDamaged

    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except CredentialsDamaged as exc:  # the owner needs the file's name, not a traceback
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
