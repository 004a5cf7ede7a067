"""`gpuflex-tray`: the tray app, a thin client of the agent's background service.

It starts the service when none runs (the installed systemd/launchd unit, else a detached
`gpuflex-node run`) and attaches to it; a second tray attaches to the same agent, and
closing a tray never stops the work.
"""

from __future__ import annotations

import argparse
import logging
import sys

from desktop import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuflex-tray", description="GPUFlex tray app")
    parser.add_argument("--version", action="version", version=f"gpuflex-tray {__version__}")
    parser.add_argument("--show", action="store_true", help="open the status window at start")
    args = parser.parse_args(argv)

    from PySide6.QtWidgets import QApplication, QMessageBox, QSystemTrayIcon

    from desktop.control import NotRunning, ensure_running
    from desktop.gui.bridge import AgentBridge
    from desktop.gui.first_run import FirstRunWizard
    from desktop.gui.icons import app_icon
    from desktop.gui.tray import TrayController

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    app = QApplication(sys.argv[:1])
    app.setApplicationName("GPUFlex")
    app.setWindowIcon(app_icon())
    app.setQuitOnLastWindowClosed(False)  # closing the window leaves the tray running

    try:
        client = ensure_running()
    except NotRunning as exc:
        QMessageBox.critical(None, "GPUFlex", f"The GPUFlex agent could not be started.\n\n{exc}")
        return 1
    bridge = AgentBridge(client)
    tray = TrayController(bridge)
    tray.show()
    if not bridge.settings().first_run_done:
        FirstRunWizard(bridge).show()
    if args.show or not QSystemTrayIcon.isSystemTrayAvailable():
        tray.show_window()  # without a tray (some Wayland desktops) the window is the app
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
