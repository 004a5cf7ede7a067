"""`gpuflex-node runtime list|fetch|verify|remove`: the training-runtime packs by hand
(docs/runtime-packs.md). The agent fetches one itself on first need; these are for owners
and operators who want to see, prefetch, check or drop one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from desktop.runtime.plan import PLANS

if TYPE_CHECKING:
    from desktop.config import Paths
    from desktop.runtime.store import Store


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("runtime", help="training-runtime packs: list, fetch, verify, remove")
    acts = s.add_subparsers(dest="action", required=True)
    a = acts.add_parser("list", help="the installed packs and the runtime in use")
    a.add_argument("--json", action="store_true")
    a = acts.add_parser("fetch", help="download, verify and install the pack for this machine")
    a.add_argument("--plan", choices=PLANS, help="default: the plan this machine's GPU runs")
    a.add_argument("--url", help="the update repository (default: $GPUFLEX_UPDATE_URL, or the "
                   "bundle's update/url.txt)")  # fmt: skip
    a.add_argument("--root", type=Path, help="the root.json to trust the first time (default: "
                   "$GPUFLEX_UPDATE_ROOT, or the bundle's update/root.json)")  # fmt: skip
    a = acts.add_parser("verify", help="re-check an installed pack's files (default: current)")
    a.add_argument("name", nargs="?", help="a pack's folder name, plan class or hash prefix")
    a = acts.add_parser("remove", help="remove an installed pack (the previous one takes over)")
    a.add_argument("name", help="a pack's folder name, plan class or hash prefix")
    s.set_defaults(fn=cmd_runtime)


def cmd_runtime(args: argparse.Namespace) -> int:
    from desktop.config import Paths
    from desktop.runtime.fetch import FetchError
    from desktop.runtime.pack import PackError
    from desktop.runtime.store import Store

    paths = Paths.default()
    store = Store(paths.data)
    try:
        if args.action == "list":
            return _list(store, paths.data, args.json)
        if args.action == "fetch":
            return _fetch(store, paths, args)
        if args.action == "verify":
            return _verify(store, args.name)
        gone = store.remove(args.name)
        now = store.current()
        print(f"removed {gone.name}; in use now: {now.name if now else 'no pack'}")
        return 0
    except (PackError, FetchError) as exc:
        print(f"gpuflex-node runtime {args.action}: {exc}", file=sys.stderr)
        return 1


def _list(store: Store, data: Path, as_json: bool) -> int:
    from desktop.runtime.active import active

    packs = store.installed()
    runtime = active(data)
    if as_json:
        print(json.dumps({
            "in_use": runtime.report() | {"path": str(runtime.site_packages or "")}
            if runtime else None,
            "installed": [{"name": p.name, "current": p.current, **p.manifest.to_dict()}
                          for p in packs],
        }, indent=2))  # fmt: skip
        return 0
    for p in packs:
        mark = "*" if p.current else " "
        print(f"{mark} {p.name}  {p.manifest.describe()}  {p.manifest.size / 2**20:.0f} MiB packed")
    if not packs:
        print("no runtime pack installed")
    print(f"in use: {runtime.describe() if runtime else 'none (gpuflex-node runtime fetch)'}")
    return 0


def _fetch(store: Store, paths: Paths, args: argparse.Namespace) -> int:
    from desktop.runtime import fetch
    from desktop.runtime_keeper import default_source

    source = default_source(paths, args.url, args.root)
    if source is None:
        raise fetch.FetchError("no update URL: pass --url or set GPUFLEX_UPDATE_URL")
    bar = _Bar()
    installed, choice = fetch.fetch(source, store, plan=args.plan, progress=bar)
    bar.close()
    print(f"{installed.name}: {installed.manifest.describe()} ({choice.reason})")
    return 0


def _verify(store: Store, name: str | None) -> int:
    pack = store.find(name) if name else store.current()
    if pack is None:
        print("no runtime pack installed", file=sys.stderr)
        return 1
    problems = store.verify(pack.name)
    for line in problems:
        print(line)
    print(f"{pack.name}: " + ("ok" if not problems else f"{len(problems)} problems"))
    return 1 if problems else 0


class _Bar:
    """A one-line progress bar on stderr: `[########            ]  41%  1.1/2.7 GiB`."""

    def __init__(self, width: int = 30) -> None:
        self.width = width
        self.shown = -1
        self.drawn = False

    def __call__(self, got: int, total: int) -> None:
        pct = 100 * got // total if total else 100
        if pct == self.shown:
            return
        self.shown = pct
        done = self.width * pct // 100
        unit, scale = ("GiB", 2**30) if total >= 2**30 else ("MiB", 2**20)
        sys.stderr.write(f"\r[{'#' * done}{' ' * (self.width - done)}] {pct:3d}%  "
                         f"{got / scale:.1f}/{total / scale:.1f} {unit}")  # fmt: skip
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
