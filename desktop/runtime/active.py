"""Which training runtime this agent's tasks run with, and what it tells the marketplace.

Chosen in this order (GPUFLEX_RUNTIME can force either; docs/runtime-packs.md):
1. the current pack in `<data>/runtimes/` (desktop/runtime/store.py), when one is installed:
   the sandbox puts its `site-packages` first on the task's PYTHONPATH and binds it read-only;
2. else the agent's own environment, when torch is installed in it (a dev install: `make dev`,
   `make demo`, the test suite; a bundle built with torch): the environment is the runtime and
   nothing is added, so everything runs as it always did;
3. else none: the agent fetches a pack on first need (`gpuflex-node runtime fetch`).
Nothing here imports torch: its version is read from torch/version.py as text.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.runtime.pack import PackError, torch_facts
from desktop.runtime.store import Store
from desktop.runtime.target import runs_here

log = logging.getLogger(__name__)

MODE_ENV = "GPUFLEX_RUNTIME"  # "pack" | "environment" | "" (the order above)
# a pack's site-packages, for the processes that import torch (tasks, the warm worker, the
# probe): a frozen bundle ignores PYTHONPATH, so its hidden commands put this first themselves
PACKAGES_ENV = "GPUFLEX_RUNTIME_PACKAGES"


def put_first_on_path() -> None:
    """In a process about to import torch: the pack named by PACKAGES_ENV first on sys.path."""
    packages = os.environ.get(PACKAGES_ENV, "")
    if packages and os.path.isabs(packages) and packages not in sys.path:
        sys.path.insert(0, packages)


def pack_env(site_packages: Path | None) -> dict[str, str]:
    """The variables that give a child process the pack's packages ({} for none)."""
    if site_packages is None:
        return {}
    path = [str(site_packages), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {PACKAGES_ENV: str(site_packages), "PYTHONPATH": os.pathsep.join(path)}


@dataclass(frozen=True)
class Runtime:
    source: str  # "pack" | "environment"
    plan: str
    torch: str
    cuda: str = ""
    rocm: str = ""
    site_packages: Path | None = None  # a pack's packages; None: the environment's own

    def report(self) -> dict[str, Any]:
        """What registration and heartbeats send as `runtime` (docs/agent-api.md)."""
        return {"plan": self.plan, "torch": self.torch, "cuda": self.cuda or self.rocm,
                "source": self.source}  # fmt: skip

    def describe(self) -> str:
        gpu = f", CUDA {self.cuda}" if self.cuda else f", ROCm {self.rocm}" if self.rocm else ""
        where = self.site_packages or "this agent's own environment"
        return f"{self.plan} runtime: torch {self.torch}{gpu} ({where})"


def _environment() -> Runtime | None:
    spec = importlib.util.find_spec("torch")  # finds, does not import
    if spec is None or not spec.origin:
        return None
    try:
        facts = torch_facts(Path(spec.origin).parent.parent)
    except PackError:
        return None
    if facts["cuda"]:
        plan = f"cuda{facts['cuda'].split('.')[0]}"
    elif facts["rocm"]:
        plan = "rocm"
    elif platform.system() == "Darwin" and platform.machine() == "arm64":
        plan = "mps"
    else:
        plan = "cpu"
    return Runtime("environment", plan, **facts)


def active(data_dir: Path) -> Runtime | None:
    mode = os.environ.get(MODE_ENV, "")
    if mode != "environment":
        try:
            pack = Store(data_dir).current()
        except PackError:
            pack = None
        if pack is not None and (why := runs_here(pack.manifest.platform, pack.manifest.python,
                                                  pack.manifest.min_os)):  # fmt: skip
            # never put another machine's packages on a task's path (a pack copied in by hand)
            log.warning("runtime pack %s not used: it is %s", pack.name, why)
            pack = None
        if pack is not None:
            m = pack.manifest
            return Runtime("pack", m.plan, m.torch, m.cuda, m.rocm, pack.site_packages)
        if mode == "pack":
            return None
    return _environment()
