"""The agent's part that gives its tasks a training runtime (docs/runtime-packs.md).

At the agent's start: the runtime in use (desktop/runtime/active.py: the current pack, else
the agent's own environment where torch is installed), and where there is none, the pack for
this machine's GPU fetched from the app's update repository on this first need, its progress
in the agent's status (`runtime.fetch` in the local API's /status). The sandbox then runs
tasks with it, and registration and heartbeats tell the marketplace which it is.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from desktop.config import Paths
from desktop.runtime import fetch
from desktop.runtime.active import Runtime, active
from desktop.runtime.plan import Machine
from desktop.runtime.store import Store

# the agent that wires this part (desktop.agent.Agent), named but not imported (no circle)
Agent = Any

URL_ENV = "GPUFLEX_UPDATE_URL"  # = desktop.updater.URL_ENV: the same repository
ROOT_ENV = "GPUFLEX_UPDATE_ROOT"  # a trusted root.json where no bundle ships one (dev)
_ONE_AT_A_TIME = threading.Lock()  # a multi-GPU host's lanes start together: one fetch


def host_paths(node: Agent) -> Paths:
    """Runtimes are the machine's, not a lane's: the host agent's folders."""
    host = node._host if node._host is not None else node
    return host.paths


def default_source(
    paths: Paths, url: str | None = None, root: Path | None = None
) -> fetch.Source | None:
    """The update repository packs come from: `url`, else $GPUFLEX_UPDATE_URL, else the
    bundle's update/url.txt; its trusted root: `root`, else $GPUFLEX_UPDATE_ROOT, else the
    bundle's update/root.json (the same the app updater trusts). None without a URL."""
    bundle = Path(sys.executable).resolve().parent if getattr(sys, "frozen", False) else None
    shipped_url = bundle / "update" / "url.txt" if bundle else None
    url = (
        url
        or os.environ.get(URL_ENV)
        or (shipped_url.read_text().strip() if shipped_url and shipped_url.is_file() else "")
    )
    if not url:
        return None
    if root is None and os.environ.get(ROOT_ENV):
        root = Path(os.environ[ROOT_ENV])
    if root is None and bundle is not None:
        root = bundle / "update" / "root.json"
    return fetch.Source(url=url.rstrip("/"), cache_dir=paths.cache / "update", root=root)


def pack_packages(node: Agent) -> Path | None:
    """The installed pack's site-packages, for the hardware probe (None: no pack)."""
    runtime = active(host_paths(node).data)
    return runtime.site_packages if runtime is not None else None


def ensure(node: Agent) -> None:
    """Fetch the pack for this machine when there is no runtime at all (its first need): the
    agent calls this before its hardware probe, which imports torch, so that an app that
    holds no torch probes with the pack. The plan needs only NVML (plan.Machine.here)."""
    paths = host_paths(node)
    if getattr(node, "_runtime_fetch_tried", False):  # once per start: a failure said why
        return
    node._runtime_fetch_tried = True
    with _ONE_AT_A_TIME:
        if active(paths.data) is None and (source := default_source(paths)) is not None:
            node._info("no training runtime here yet: fetching the pack for this machine")
            _fetch(node, source, paths)


def prepare(node: Agent) -> Runtime | None:
    """The runtime this agent's tasks run with, fetched on first need; the sandbox set to it."""
    ensure(node)  # done already before the probe, unless this agent was given its hardware
    runtime = active(host_paths(node).data)
    if runtime is None:
        node._warn(
            "no training runtime: tasks cannot train until one is fetched "
            "(gpuflex-node runtime fetch, docs/runtime-packs.md)"
        )
    else:
        node._info(runtime.describe())
    if node._sandbox is not None:
        node._sandbox.use_runtime(runtime.site_packages if runtime else None)
    node._set(runtime=runtime.report() if runtime else {})
    return runtime


def _fetch(node: Agent, source: fetch.Source, paths: Paths) -> None:
    hw = node._hardware
    machine = Machine.from_gpus(hw.gpus) if hw is not None else Machine.here()
    last = [0.0]

    def progress(got: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or got == total:  # the status, not every chunk
            last[0] = now
            node._set(runtime={"fetch": {"bytes": got, "total": total}})

    try:
        installed, choice = fetch.fetch(source, Store(paths.data), machine=machine,
                                        progress=progress)  # fmt: skip
    except fetch.FetchError as exc:
        node._warn(f"runtime pack not fetched: {exc}")
        return
    node._info(f"runtime pack {installed.manifest.describe()} installed ({choice.reason})")
