"""How the agent starts its own programs (the task runner, the warm worker, the probe)."""

from __future__ import annotations

import sys
from pathlib import Path


def entry_argv(module: str, command: str, *args: str) -> list[str]:
    """`python -m module args…`; in a PyInstaller bundle, which has no `-m`, the bundled
    gpuflex-node's hidden `command` (see desktop.cli) instead."""
    if getattr(sys, "frozen", False):
        exe = Path(sys.executable)
        node = exe.with_name("gpuflex-node" + exe.suffix)
        return [str(node if node.exists() else exe), command, *args]
    return [sys.executable, "-m", module, *args]


def node_command() -> list[str]:
    """How to run the headless agent (the service): the bundled gpuflex-node, else this
    Python."""
    if getattr(sys, "frozen", False):
        exe = Path(sys.executable)
        node = exe.with_name("gpuflex-node" + exe.suffix)
        return [str(node if node.exists() else exe), "run"]
    return [sys.executable, "-m", "desktop.cli", "run"]
