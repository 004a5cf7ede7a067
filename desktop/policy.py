"""When this machine may work, like BOINC's computing preferences.

`decide` is a pure function of the policy and an `Observations` snapshot, so every rule is
testable with hand-built inputs; `observe` gathers the snapshot from the real machine (idle
time, battery, GPU temperature and processes), answering None for anything it cannot tell.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import psutil

from desktop.config import Settings
from desktop.hardware import gpu_metrics
from desktop.mac_thermal import MacThermal, mac_thermal

TEMP_HYSTERESIS_C = 5.0  # resume only this far below the limit, so work does not flap
# where a GPU's processes cannot be listed (AMD through pyamdgpuinfo), a load this high while
# no task of ours runs on it means another program uses it
BUSY_LOAD_PCT = 30.0


@dataclass(frozen=True)
class WorkPolicy:
    idle_minutes: float = 0.0  # 0: work even while the owner uses the computer
    pause_on_gpu_processes: bool = True
    max_gpu_temp_c: float | None = 83.0
    schedule: tuple[dt.time, dt.time] | None = None  # allowed window; may wrap past midnight
    work_on_battery: bool = False
    gpu_memory_fraction: float = 0.9  # cap handed to the task (torch's per-process fraction)

    @classmethod
    def from_settings(cls, s: Settings) -> WorkPolicy:
        schedule = None
        if s.schedule_start and s.schedule_end:
            schedule = (parse_hhmm(s.schedule_start), parse_hhmm(s.schedule_end))
        return cls(
            idle_minutes=s.idle_minutes,
            pause_on_gpu_processes=s.pause_on_gpu_processes,
            max_gpu_temp_c=s.max_gpu_temp_c or None,
            schedule=schedule,
            work_on_battery=s.work_on_battery,
            gpu_memory_fraction=s.gpu_memory_fraction,
        )


def parse_hhmm(text: str) -> dt.time:
    hours, minutes = text.strip().split(":")
    return dt.time(int(hours), int(minutes))


@dataclass(frozen=True)
class Observations:
    now: dt.datetime
    idle_s: float | None = None  # seconds since the last keyboard/mouse input
    on_battery: bool | None = None
    gpu_temp_c: float | None = None
    other_gpu_processes: list[tuple[int, int]] | None = None  # (pid, MB); None: cannot tell
    gpu_load_pct: float | None = None  # the GPU's load, judged when processes are unknown
    mac_thermal: MacThermal | None = None  # macOS's own word on heat (Apple GPUs)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reasons: list[str] = field(default_factory=list)  # why not, in words for the tray

    def __str__(self) -> str:
        return "allowed" if self.allowed else "; ".join(self.reasons)


def in_window(now: dt.time, start: dt.time, end: dt.time) -> bool:
    if start == end:
        return True
    if start < end:
        return start <= now < end
    return now >= start or now < end  # e.g. 22:00-07:00


def decide(policy: WorkPolicy, obs: Observations, working: bool = False) -> Decision:
    """May the node work now? `working` says whether it currently is (temperature hysteresis)."""
    reasons = []
    if policy.schedule and not in_window(obs.now.time(), *policy.schedule):
        start, end = policy.schedule
        reasons.append(f"outside the schedule ({start:%H:%M}-{end:%H:%M})")
    if not policy.work_on_battery and obs.on_battery:
        reasons.append("on battery")
    if policy.idle_minutes > 0 and obs.idle_s is not None and obs.idle_s < policy.idle_minutes * 60:
        reasons.append(
            f"computer in use (idle {obs.idle_s / 60:.0f} of {policy.idle_minutes:g} min)"
        )
    if policy.max_gpu_temp_c is not None and obs.gpu_temp_c is not None:
        limit = policy.max_gpu_temp_c - (0.0 if working else TEMP_HYSTERESIS_C)
        if obs.gpu_temp_c >= limit:
            reasons.append(f"GPU at {obs.gpu_temp_c:.0f} °C (limit {policy.max_gpu_temp_c:.0f} °C)")
    if policy.pause_on_gpu_processes and obs.other_gpu_processes:
        # names, not pids: the reason is also what buyers see, grouped across nodes
        names = list(dict.fromkeys(_proc_name(pid) for pid, _ in obs.other_gpu_processes))
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        reasons.append(f"another program uses the GPU ({', '.join(names[:3])}{more})")
    elif (
        policy.pause_on_gpu_processes
        and obs.other_gpu_processes is None
        and not working  # while a task runs the load is largely its own: it cannot tell
        and obs.gpu_load_pct is not None
        and obs.gpu_load_pct >= BUSY_LOAD_PCT
    ):
        reasons.append(f"another program keeps the GPU busy ({obs.gpu_load_pct:.0f}% load)")
    if policy.max_gpu_temp_c is not None and obs.mac_thermal is not None and obs.mac_thermal.hot:
        reasons.append(f"the Mac is hot ({obs.mac_thermal})")
    return Decision(not reasons, reasons)


def _proc_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return f"pid {pid}"


# ------------------------------------------------------------------------- observing


def idle_seconds() -> float | None:
    """Seconds since the owner last touched keyboard or mouse; None where unknown (headless)."""
    try:
        if sys.platform == "win32":
            return _idle_windows()
        if sys.platform == "darwin":
            return _idle_macos()
        return _idle_linux()
    except Exception:
        return None


def _idle_windows() -> float | None:
    class LASTINPUTINFO(ctypes.Structure):
        _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]

    info = LASTINPUTINFO()
    info.cbSize = ctypes.sizeof(info)
    if not ctypes.windll.user32.GetLastInputInfo(ctypes.byref(info)):  # type: ignore[attr-defined]
        return None
    return (ctypes.windll.kernel32.GetTickCount() - info.dwTime) / 1000.0  # type: ignore[attr-defined]


def _idle_macos() -> float | None:
    out = subprocess.run(
        ["ioreg", "-c", "IOHIDSystem"], capture_output=True, text=True, timeout=5
    ).stdout
    for line in out.splitlines():
        if "HIDIdleTime" in line:
            return int(line.rsplit("=", 1)[1].strip()) / 1e9
    return None


def _idle_linux() -> float | None:
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return None  # no graphical session: a server, nobody to get in the way of
    if shutil.which("xprintidle") and os.environ.get("DISPLAY"):
        out = subprocess.run(["xprintidle"], capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return int(out.stdout.strip()) / 1000.0
    if shutil.which("gdbus"):  # GNOME (X11 and Wayland)
        out = subprocess.run(
            ["gdbus", "call", "--session", "--dest", "org.gnome.Mutter.IdleMonitor",
             "--object-path", "/org/gnome/Mutter/IdleMonitor/Core",
             "--method", "org.gnome.Mutter.IdleMonitor.GetIdletime"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
        if out.returncode == 0:
            digits = "".join(c for c in out.stdout.split(",")[0] if c.isdigit())
            return int(digits) / 1000.0 if digits else None
    return None


def on_battery() -> bool | None:
    try:
        battery = psutil.sensors_battery()
    except Exception:
        return None
    return None if battery is None else not battery.power_plugged


def observe(own_pids: set[int] | None = None, gpu_index: int = 0) -> Observations:
    m = gpu_metrics(gpu_index, own_pids)
    return Observations(
        now=dt.datetime.now(),
        idle_s=idle_seconds(),
        on_battery=on_battery(),
        gpu_temp_c=m.temperature_c,
        other_gpu_processes=m.other_processes,
        gpu_load_pct=m.utilization_pct,
        mac_thermal=mac_thermal() if sys.platform == "darwin" else None,
    )
