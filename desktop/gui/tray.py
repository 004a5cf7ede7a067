"""The tray icon and its menu; its look follows the agent's state (through the bridge)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from PySide6.QtCore import QObject, QUrl
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtWidgets import QApplication, QMenu, QSystemTrayIcon

from desktop.agent import AgentStatus, State
from desktop.gui.bridge import AgentBridge
from desktop.gui.icons import LABELS, state_icon
from desktop.gui.settings_dialog import SettingsDialog
from desktop.gui.status_window import StatusWindow
from desktop.gui.style import STYLE
from desktop.money import credits


class TrayController(QObject):
    def __init__(self, bridge: AgentBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.window: StatusWindow | None = None
        self.tray = QSystemTrayIcon(state_icon("starting"), self)
        self.menu = QMenu()
        self.menu.setStyleSheet(STYLE)
        self.status_action = QAction("GPUFlex — starting…", self.menu)
        self.status_action.setEnabled(False)
        self.task_action = QAction("", self.menu)
        self.task_action.setEnabled(False)
        self.task_action.setVisible(False)
        self.earnings_action = QAction("", self.menu)
        self.earnings_action.setEnabled(False)
        self.pause_action = QAction("Pause", self.menu)
        self.pause_action.triggered.connect(bridge.toggle_pause)
        self.open_action = QAction("Open status window", self.menu)
        self.open_action.triggered.connect(self.show_window)
        self.dashboard_action = QAction("Open dashboard", self.menu)
        self.dashboard_action.triggered.connect(self.open_dashboard)
        self.settings_action = QAction("Settings…", self.menu)
        self.settings_action.triggered.connect(self.show_settings)
        self.stop_action = QAction("Stop the agent", self.menu)
        self.stop_action.triggered.connect(bridge.stop_agent)
        # closing the tray never stops the work: the agent is its own background service
        self.quit_action = QAction("Close this tray (work goes on)", self.menu)
        self.quit_action.triggered.connect(self.quit)
        items = [self.status_action, self.task_action, self.earnings_action, None,
                 self.pause_action, self.open_action, self.dashboard_action,
                 self.settings_action, None, self.stop_action, self.quit_action]  # fmt: skip
        for item in items:
            if item is None:
                self.menu.addSeparator()
            else:
                self.menu.addAction(item)
        self.lane_actions: list[QAction] = []  # one line per GPU on a multi-GPU machine
        self.tray.setContextMenu(self.menu)
        self.tray.activated.connect(self._activated)
        bridge.status_changed.connect(self.update_status)
        bridge.notify.connect(self.notify)
        bridge.stopped.connect(QApplication.quit)
        self.update_status(bridge.status)

    def show(self) -> None:
        self.tray.show()

    def update_status(self, st: AgentStatus) -> None:
        state = st.state.value
        self.tray.setIcon(state_icon(state))
        self.status_action.setIcon(state_icon(state))
        label = LABELS.get(state, state)
        line = f"GPUFlex — {label}" + (f": {st.reason}" if st.reason else "")
        self.status_action.setText(line if len(line) < 70 else line[:67] + "…")
        if st.task is not None:
            self.task_action.setText(f"Task {st.task.id[:10]} · {100 * st.task.progress:.0f}%")
        self.task_action.setVisible(st.task is not None)
        self._show_lanes([lane.line() for lane in st.lanes])
        held = f" · {credits(st.earnings_held)} on hold" if _nonzero(st.earnings_held) else ""
        self.earnings_action.setText(
            f"Earned {credits(st.earnings_today)} today · {credits(st.earnings_total)} in total"
            + held  # unverified work's pay waits out the server's payout hold
        )
        self.pause_action.setText("Resume" if st.state is State.PAUSED else "Pause")
        lanes = "".join(f"\n{lane.line()}" for lane in st.lanes)
        self.tray.setToolTip(f"{line}{lanes}\nEarned today {credits(st.earnings_today)}")

    def _show_lanes(self, lines: list[str]) -> None:
        """Which GPU does what, and why one waits (a game on GPU 1)."""
        while len(self.lane_actions) < len(lines):
            action = QAction("", self.menu)
            action.setEnabled(False)
            self.menu.insertAction(self.earnings_action, action)
            self.lane_actions.append(action)
        for i, action in enumerate(self.lane_actions):
            text = lines[i] if i < len(lines) else ""
            action.setText(text if len(text) < 80 else text[:77] + "…")
            action.setVisible(i < len(lines))

    def notify(self, title: str, message: str) -> None:
        if self.tray.supportsMessages():
            self.tray.showMessage(title, message, state_icon("working"), 5000)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.show_window()

    def show_window(self) -> StatusWindow:
        if self.window is None:
            self.window = StatusWindow(self.bridge)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window

    def show_settings(self) -> SettingsDialog:
        dialog = SettingsDialog(self.bridge)
        dialog.open()  # not exec(): the agent's signals keep flowing meanwhile
        return dialog

    def open_dashboard(self) -> None:
        s = self.bridge.settings()
        QDesktopServices.openUrl(QUrl(s.dashboard_url or s.server_url.rstrip("/") + "/"))

    def quit(self) -> None:
        self.tray.hide()
        self.bridge.close()


def _nonzero(value: str) -> bool:
    """Whether a money figure the server sent is above zero (anything unreadable is not)."""
    try:
        return Decimal(value) > 0
    except InvalidOperation:
        return False
