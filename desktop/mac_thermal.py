"""How hot macOS says the Mac is, without root: the work policy's Apple counterpart to a GPU
temperature (Apple GPUs report none to a user process).

Two sources, each a subprocess (the agent never loads Apple's frameworks itself: it forks to
start its tasks): NSProcessInfo's `thermalState` through JavaScript for Automation
(`osascript -l JavaScript`), and `pmset -g therm`, whose `CPU_Speed_Limit` says how far
macOS holds the processor back for heat or power. Both are read at most every CACHE_S.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass

# NSProcessInfoThermalState, in order: 0 nominal ... 3 critical
THERMAL_STATES = ("nominal", "fair", "serious", "critical")
HOT_STATES = ("serious", "critical")  # Apple: "reduce the work you do" from serious on
CACHE_S = 10.0  # the policy asks twice a second while a task runs; a subprocess is not free

_JXA = "ObjC.import('Foundation'); $.NSProcessInfo.processInfo.thermalState"
_SPEED = re.compile(r"^\s*CPU_Speed_Limit\s*=\s*(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class MacThermal:
    state: str | None  # one of THERMAL_STATES; None where macOS did not say
    cpu_speed_limit_pct: int | None  # 100: not held back; None: nothing recorded

    @property
    def hot(self) -> bool:
        if self.state is not None:
            return self.state in HOT_STATES
        return self.cpu_speed_limit_pct is not None and self.cpu_speed_limit_pct < 100

    def __str__(self) -> str:
        parts = [f"thermal state {self.state}"] if self.state else []
        if self.cpu_speed_limit_pct is not None and self.cpu_speed_limit_pct < 100:
            parts.append(f"CPU held to {self.cpu_speed_limit_pct}%")
        return ", ".join(parts) or "no thermal figures"


def parse_thermal_state(text: str) -> str | None:
    """osascript's answer (`2`) as a state name."""
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return THERMAL_STATES[value] if 0 <= value < len(THERMAL_STATES) else None


def parse_pmset_therm(text: str) -> int | None:
    """`pmset -g therm`'s CPU_Speed_Limit (percent); None when no power status is recorded
    ("Note: No CPU power status has been recorded")."""
    match = _SPEED.search(text)
    return int(match.group(1)) if match else None


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def read() -> MacThermal:
    """Both figures, now (two short subprocesses)."""
    state = _run(["/usr/bin/osascript", "-l", "JavaScript", "-e", _JXA])
    therm = _run(["/usr/bin/pmset", "-g", "therm"])
    return MacThermal(
        state=None if state is None else parse_thermal_state(state),
        cpu_speed_limit_pct=None if therm is None else parse_pmset_therm(therm),
    )


_lock = threading.Lock()
_last: tuple[float, MacThermal] | None = None


def mac_thermal() -> MacThermal:
    """`read()`, reused for CACHE_S."""
    global _last
    with _lock:
        if _last is None or time.monotonic() - _last[0] >= CACHE_S:
            _last = (time.monotonic(), read())
        return _last[1]
