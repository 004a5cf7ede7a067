"""Settings: server and login, price, task limits, and when this machine may work."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.config import Settings
from desktop.control import ControlError, NotRunning
from desktop.gui.bridge import AgentBridge
from desktop.gui.datasets_page import DatasetsPage
from desktop.gui.icons import app_icon
from desktop.gui.policy_page import PolicyFields
from desktop.gui.style import STYLE


def _form(tabs: QTabWidget, title: str) -> QFormLayout:
    page = QWidget()
    form = QFormLayout(page)
    form.setContentsMargins(18, 16, 18, 16)
    form.setVerticalSpacing(10)
    form.setHorizontalSpacing(16)
    tabs.addTab(page, title)
    return form


def _hint(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("muted")
    label.setWordWrap(True)
    return label


class SettingsDialog(QDialog):
    def __init__(self, bridge: AgentBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        s = self._loaded = bridge.settings()
        self.setWindowTitle("GPUFlex settings")
        self.setWindowIcon(app_icon())
        self.setStyleSheet(STYLE)
        self.resize(520, 440)
        root = QVBoxLayout(self)
        root.setContentsMargins(16, 16, 16, 12)
        tabs = self.tabs = QTabWidget()
        root.addWidget(tabs)

        f = _form(tabs, "Account")
        self.server = QLineEdit(s.server_url)
        f.addRow("Marketplace", self.server)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        has_key = bool(bridge.login_info.get("provider_key"))
        self.key.setPlaceholderText("saved — type to replace" if has_key else "gfx_u_…")
        f.addRow("Provider API key", self.key)
        self.name = QLineEdit(s.node_name)
        self.name.setPlaceholderText("this computer's name on the marketplace")
        f.addRow("Node name", self.name)
        self.price = QDoubleSpinBox()
        self.price.setRange(0.0, 100.0)
        self.price.setDecimals(2)
        self.price.setSingleStep(0.05)
        self.price.setSuffix(" credits per GPU hour")
        self.price.setValue(float(s.price_per_gpu_hour))
        f.addRow("Price", self.price)
        self.autostart = QCheckBox("Start GPUFlex when I log in")
        self.autostart.setChecked(s.start_at_login)
        f.addRow("", self.autostart)
        f.addRow(_hint(f"Keys are kept in the {bridge.login_info.get('backend') or 'agent'}."))

        f = _form(tabs, "When to work")
        self.idle = QSpinBox()
        self.idle.setRange(0, 240)
        self.idle.setSuffix(" min")
        self.idle.setSpecialValueText("always")
        self.idle.setValue(int(s.idle_minutes))
        f.addRow("Only after idle for", self.idle)
        self.policy = PolicyFields(s)
        self.use_schedule, self.temp, self.busy = (
            self.policy.use_schedule,
            self.policy.temp,
            self.policy.busy,
        )
        self.policy.add_schedule(f)
        self.battery = QCheckBox("Work while on battery")
        self.battery.setChecked(s.work_on_battery)
        f.addRow("", self.battery)
        self.gpu_procs = QCheckBox("Pause while another program uses the GPU (games)")
        self.gpu_procs.setChecked(s.pause_on_gpu_processes)
        f.addRow("", self.gpu_procs)
        f.addRow("Pause above", self.temp)
        f.addRow("GPU busy at most", self.busy)

        f = _form(tabs, "Limits")
        self.gpu_mem = QSpinBox()
        self.gpu_mem.setRange(10, 100)
        self.gpu_mem.setSuffix(" % of GPU memory")
        self.gpu_mem.setValue(round(100 * s.gpu_memory_fraction))
        f.addRow("GPU memory", self.gpu_mem)
        self.mem = QSpinBox()
        self.mem.setRange(512, 1_048_576)
        self.mem.setSingleStep(512)
        self.mem.setSuffix(" MB")
        self.mem.setValue(s.task_memory_mb)
        f.addRow("Memory per task", self.mem)
        self.wall = QSpinBox()
        self.wall.setRange(10, 86_400)
        self.wall.setSuffix(" s")
        self.wall.setValue(s.task_wall_s)
        f.addRow("Time per task", self.wall)
        f.addRow(_hint("Tasks run in a sandbox without network access; a task over these "
                       "limits is stopped and reported."))  # fmt: skip
        # several GPUs: each works as its own node (desktop.lanes); the owner may keep some
        hw = bridge.status.hardware
        gpus = hw.gpus if hw is not None and len(hw.gpus) > 1 else []
        self.lend: dict[int, QCheckBox] = {}
        for g in gpus:
            box = QCheckBox(f"GPU {g.index}: {g.name}")
            box.setChecked(g.index not in s.excluded_gpus)
            f.addRow("Lend" if not self.lend else "", box)
            self.lend[g.index] = box
        if gpus:
            f.addRow(_hint("Each GPU lent works as a node of its own; a change applies when "
                           "the agent starts again."))  # fmt: skip

        self.datasets = DatasetsPage(bridge.client)
        tabs.addTab(self.datasets, "Datasets")

        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.button(QDialogButtonBox.StandardButton.Save).setObjectName("primary")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.error = QLabel()
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        self.error.setVisible(False)
        root.addWidget(self.error)
        root.addWidget(buttons)

    def settings(self) -> Settings:
        """The settings as edited (the widgets only collect values)."""
        s = self._loaded
        edited = replace(
            s,
            server_url=self.server.text().strip() or s.server_url,
            node_name=self.name.text().strip(),
            price_per_gpu_hour=f"{self.price.value():.2f}",
            start_at_login=self.autostart.isChecked(),
            idle_minutes=float(self.idle.value()),
            work_on_battery=self.battery.isChecked(),
            pause_on_gpu_processes=self.gpu_procs.isChecked(),
            gpu_memory_fraction=self.gpu_mem.value() / 100,
            task_memory_mb=self.mem.value(),
            task_wall_s=self.wall.value(),
            excluded_gpus=sorted(
                {i for i in s.excluded_gpus if i not in self.lend}
                | {i for i, box in self.lend.items() if not box.isChecked()}
            ),
        )
        return self.policy.applied(edited)  # schedule, temperature, GPU use

    def accept(self) -> None:
        """The agent checks and saves (and applies start at login); its refusal stays shown."""
        try:
            self.bridge.save_settings(self.settings(), self.key.text().strip() or None)
        except (ControlError, NotRunning) as exc:
            self.error.setText(str(exc))
            self.error.setVisible(True)
            return
        super().accept()
