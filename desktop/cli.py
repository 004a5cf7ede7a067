"""`gpuflex-node`: the contributor agent from a terminal (and from systemd on servers)."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import signal
import sys
from typing import Any

from desktop import __version__


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_info(args: argparse.Namespace) -> int:
    from desktop.hardware import detect
    from desktop.sandbox import bwrap_usable

    hw = detect()
    if args.json:
        _print_json({**hw.to_dict(), "fingerprint": hw.fingerprint(), "sandbox": bwrap_usable()})
    else:
        print(hw.summary())
        print(f"sandbox {'bubblewrap' if bwrap_usable() else 'rlimits only (bwrap missing)'}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from desktop.benchmark import benchmark
    from desktop.config import Paths
    from desktop.hardware import detect

    hw = detect()
    if not args.json:
        print(f"benchmarking {hw.primary_gpu.name if hw.primary_gpu else hw.cpu_name}…",
              file=sys.stderr)  # fmt: skip
    result, cached = benchmark(hw, Paths.default().cache, quick=args.quick, force=args.force)
    if args.json:
        _print_json({**result.to_dict(), "cached": cached})
    else:
        print(result.summary())
        print("(from cache; --force to re-run)" if cached else f"took {result.duration_s:.1f} s")
    return 0


def cmd_login(args: argparse.Namespace) -> int:
    from desktop.config import Credentials, load_settings, save_settings

    settings = load_settings()
    if args.server:
        settings.server_url = args.server
    if args.price:
        settings.price_per_gpu_hour = args.price
    if args.name:
        settings.node_name = args.name
    if args.platform_token:  # an operator enrolls this machine as a platform node
        settings.kind, settings.enrollment_token = "platform", args.platform_token
    key = args.key or getpass.getpass("Provider API key (gfx_u_…): ")
    if not key.startswith("gfx_u_"):
        print("that does not look like a provider key (they start with gfx_u_)", file=sys.stderr)
        return 2
    creds = Credentials()
    creds.set_provider_key(key)
    creds.set_node_key(settings.server_url, None)  # register afresh with this account
    settings.first_run_done = True
    save_settings(settings)
    print(f"saved for {settings.server_url} in the {creds.backend}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from desktop.agent import Agent
    from desktop.config import load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
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
    if args.byzantine_scale is not None and not (args.byzantine and args.byzantine_scale > 0):
        print("--byzantine-scale needs --byzantine and a positive scale", file=sys.stderr)
        return 2
    if args.byzantine:  # kept out of the saved settings: only this run attacks
        from desktop.task_runner import BYZANTINE_SCALES

        scale = args.byzantine_scale or BYZANTINE_SCALES[args.byzantine]
        settings.extra["byzantine"] = f"{args.byzantine}:{scale}"
    agent = Agent(settings, claim_wait_s=args.claim_wait)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # run_forever stops gracefully

    signal.signal(signal.SIGTERM, on_term)
    agent.run_forever()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from desktop.config import Credentials, Paths, load_settings

    paths = Paths.default()
    settings = load_settings(paths)
    try:
        local = json.loads((paths.data / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        local = {"state": "stopped", "note": "no agent has run here yet"}
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
    print(
        f"agent     {local.get('state')}" + (f" ({local['reason']})" if local.get("reason") else "")
    )
    print(f"server    {settings.server_url}" + ("" if key else " (not registered)"))
    if task:
        print(f"task      {task['id']} {task['phase']} {100 * task['progress']:.0f}%")
    print(f"done      {local.get('completed', 0)} ok, {local.get('failed', 0)} failed (this run)")
    if remote and "earnings" in remote:
        e = remote["earnings"]
        print(f"earnings  today {e.get('today')}, total {e.get('total')}")
    elif remote:
        print(f"marketplace: {remote.get('error')}")
    return 0


def cmd_zygote(args: argparse.Namespace) -> int:
    from desktop.task_zygote import main as run_zygote

    return run_zygote()


def cmd_probe(args: argparse.Namespace) -> int:
    from desktop.probe import main as run_probe

    return run_probe(args.rest)


def cmd_task(args: argparse.Namespace) -> int:
    from desktop.task_runner import main as run_task

    return run_task([args.folder])


def build_parser() -> argparse.ArgumentParser:
    from desktop.task_runner import BYZANTINE_SCALES  # no torch at import: cheap

    p = argparse.ArgumentParser(prog="gpuflex-node", description="GPUFlex contributor agent")
    p.add_argument("--version", action="version", version=f"gpuflex-node {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="{info,bench,login,run,status}")

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

    s = sub.add_parser("run", help="run the agent in the foreground (headless)")
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
        "--byzantine",
        choices=tuple(BYZANTINE_SCALES),
        help="FAULT INJECTION, for testing robust aggregation only: this node attacks every "
        "job it works on by sending corrupted updates (sign_flip: -scale x its real update; "
        "noise: its update plus Gaussian noise of scale x its norm)",
    )
    s.add_argument(
        "--byzantine-scale",
        type=float,
        help="how hard --byzantine attacks (default: "
        + ", ".join(f"{v:g} for {k}" for k, v in BYZANTINE_SCALES.items())
        + ")",
    )
    s.add_argument("--claim-wait", type=int, default=20, help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("status", help="what the agent is doing, and earnings")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)

    # what the sandbox runs inside a PyInstaller bundle (no `python -m` there)
    s = sub.add_parser("_zygote")  # the warm task worker, in a frozen app (desktop/warm.py)
    s.add_argument("folder")
    s.set_defaults(fn=cmd_zygote)
    s = sub.add_parser("_task")
    s.add_argument("folder")
    s.set_defaults(fn=cmd_task)
    s = sub.add_parser("_probe", add_help=False)  # hardware and benchmark (desktop/probe.py)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
