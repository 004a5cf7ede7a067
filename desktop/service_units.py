"""The agent as a per-user background service, through each platform's own mechanism.

Linux: a systemd user unit (~/.config/systemd/user/gpuflex-node.service). macOS: a
LaunchAgent (~/Library/LaunchAgents/io.gpuflex.node.plist). Windows (WINDOWS-ONLY, not run
here): the per-user Run key starts `gpuflex-node run` at login. The text of each is built
by a pure function (tested on any OS); `install(start=True)` also asks the service manager
to start it now, which needs a user session (`systemctl --user`, `launchctl`).
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from desktop.entry import node_command

UNIT = "gpuflex-node.service"
LABEL = "io.gpuflex.node"
RUN_VALUE = "GPUFlexNode"  # beside the tray's "GPUFlex" (desktop.autostart)


def systemd_unit(command: list[str], env: dict[str, str] | None = None) -> str:
    lines = [
        "[Unit]",
        "Description=GPUFlex contributor agent (trains models for the GPUFlex marketplace)",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={shlex.join(command)}",
        *(f"Environment={shlex.quote(f'{k}={v}')}" for k, v in sorted((env or {}).items())),
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM: the agent stops its task gracefully and journals it (desktop.agent.stop)
        "KillMode=mixed",
        "TimeoutStopSec=60",
        "Nice=10",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def launch_agent(command: list[str], log_file: Path, env: dict[str, str] | None = None) -> bytes:
    plist: dict[str, object] = {
        "Label": LABEL,
        "ProgramArguments": command,
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restarted after a crash, not after stop
        "ProcessType": "Background",
        "LowPriorityIO": True,
        "StandardOutPath": str(log_file),
        "StandardErrorPath": str(log_file),
    }
    if env:
        plist["EnvironmentVariables"] = dict(env)
    return plistlib.dumps(plist)


def windows_run_value(command: list[str]) -> str:
    return subprocess.list2cmdline(command)


def _config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def unit_file(platform: str = sys.platform) -> Path | None:
    if platform.startswith("linux"):
        return _config_home() / "systemd" / "user" / UNIT
    if platform == "darwin":
        return Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    return None


def _folder_env() -> dict[str, str]:
    """The folder overrides in force now, so the service serves the same data folder."""
    names = ("GPUFLEX_NODE_CONFIG_DIR", "GPUFLEX_NODE_DATA_DIR", "GPUFLEX_NODE_CACHE_DIR")
    return {n: os.environ[n] for n in names if os.environ.get(n)}


def install(platform: str = sys.platform, start: bool = False) -> str:
    """Writes the unit (or the Run value); with `start`, enables and starts it now."""
    command = node_command()
    env = _folder_env()
    path = unit_file(platform)
    if platform.startswith("linux") and path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(systemd_unit(command, env), encoding="utf-8")
        if start:
            _run(["systemctl", "--user", "daemon-reload"])
            _run(["systemctl", "--user", "enable", "--now", UNIT])
        return str(path)
    if platform == "darwin" and path is not None:
        from desktop.config import Paths

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(launch_agent(command, Paths.default().data / "agent.log", env))
        if start:
            _run(["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)])
        return str(path)
    if platform == "win32":  # WINDOWS-ONLY
        import winreg  # type: ignore[import-not-found]

        from desktop.autostart import RUN_KEY

        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            winreg.SetValueEx(key, RUN_VALUE, 0, winreg.REG_SZ, windows_run_value(command))
        return f"HKCU\\{RUN_KEY}\\{RUN_VALUE}"
    raise OSError(f"no per-user service on {platform}")


def uninstall(platform: str = sys.platform) -> None:
    path = unit_file(platform)
    if platform.startswith("linux") and path is not None:
        if path.exists() and shutil.which("systemctl"):
            subprocess.run(["systemctl", "--user", "disable", "--now", UNIT], check=False)
        path.unlink(missing_ok=True)
    elif platform == "darwin" and path is not None:
        if path.exists():
            subprocess.run(["launchctl", "bootout", f"gui/{os.getuid()}", str(path)], check=False)
        path.unlink(missing_ok=True)
    elif platform == "win32":  # WINDOWS-ONLY
        import contextlib
        import winreg  # type: ignore[import-not-found]

        from desktop.autostart import RUN_KEY

        with (
            winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key,
            contextlib.suppress(FileNotFoundError),
        ):
            winreg.DeleteValue(key, RUN_VALUE)


def is_installed(platform: str = sys.platform) -> bool:
    path = unit_file(platform)
    return path is not None and path.exists()


def start_installed(platform: str = sys.platform) -> str:
    """Start the installed service through its manager; "" where none is installed or the
    manager is not reachable (no user session): the caller then spawns the agent itself."""
    if not is_installed(platform):
        return ""
    if platform.startswith("linux") and shutil.which("systemctl"):
        done = subprocess.run(["systemctl", "--user", "start", UNIT], capture_output=True)
        return f"systemctl --user start {UNIT}" if done.returncode == 0 else ""
    if platform == "darwin":
        done = subprocess.run(["launchctl", "kickstart", f"gui/{os.getuid()}/{LABEL}"],
                              capture_output=True)  # fmt: skip
        return f"launchctl kickstart {LABEL}" if done.returncode == 0 else ""
    return ""


def _run(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        raise OSError(f"{argv[0]} is not available: the unit is written; start it yourself")
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{shlex.join(argv)} failed: {done.stderr.strip()[:300]}")
