"""Start the tray app at login, through each platform's own mechanism (no Qt here).

Linux: an XDG autostart entry (~/.config/autostart/gpuflex-tray.desktop). macOS: a
LaunchAgent plist (~/Library/LaunchAgents). Windows: the per-user Run registry key.
"""

from __future__ import annotations

import contextlib
import os
import plistlib
import shlex
import sys
from pathlib import Path

APP_ID = "io.gpuflex.tray"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def tray_command() -> list[str]:
    """How to start the tray app: the frozen executable in a bundle, else this Python."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "desktop.gui.app"]


def _xdg_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autostart" / "gpuflex-tray.desktop"


def _launch_agent_file() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{APP_ID}.plist"


def desktop_entry(command: list[str]) -> str:
    return "\n".join(
        [
            "[Desktop Entry]",
            "Type=Application",
            "Name=GPUFlex",
            "Comment=Earn with your GPU: train models for the GPUFlex marketplace",
            f"Exec={shlex.join(command)}",
            "Icon=gpuflex",
            "Terminal=false",
            "Categories=Utility;",
            "X-GNOME-Autostart-enabled=true",
            "X-GNOME-Autostart-Delay=10",
            "",
        ]
    )


def enable(platform: str = sys.platform) -> Path | str:
    command = tray_command()
    if platform.startswith("linux"):
        path = _xdg_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(desktop_entry(command), encoding="utf-8")
        return path
    if platform == "darwin":
        path = _launch_agent_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        plist = {"Label": APP_ID, "ProgramArguments": command, "RunAtLoad": True,
                 "ProcessType": "Interactive"}  # fmt: skip
        path.write_bytes(plistlib.dumps(plist))
        return path
    if platform == "win32":
        import winreg  # type: ignore[import-not-found]

        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            winreg.SetValueEx(key, "GPUFlex", 0, winreg.REG_SZ, _win_cmdline(command))
        return f"HKCU\\{RUN_KEY}\\GPUFlex"
    raise OSError(f"start at login is not supported on {platform}")


def disable(platform: str = sys.platform) -> None:
    if platform.startswith("linux"):
        _xdg_file().unlink(missing_ok=True)
    elif platform == "darwin":
        _launch_agent_file().unlink(missing_ok=True)
    elif platform == "win32":
        import winreg  # type: ignore[import-not-found]

        access = winreg.KEY_SET_VALUE
        with (
            winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, access) as key,
            contextlib.suppress(FileNotFoundError),
        ):
            winreg.DeleteValue(key, "GPUFlex")


def is_enabled(platform: str = sys.platform) -> bool:
    if platform.startswith("linux"):
        return _xdg_file().exists()
    if platform == "darwin":
        return _launch_agent_file().exists()
    if platform == "win32":
        import winreg  # type: ignore[import-not-found]

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.QueryValueEx(key, "GPUFlex")
            return True
        except OSError:
            return False
    return False


def apply(enabled: bool) -> None:
    if enabled:
        enable()
    else:
        disable()


def _win_cmdline(command: list[str]) -> str:
    return " ".join(f'"{part}"' if " " in part else part for part in command)
