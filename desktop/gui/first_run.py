"""First run: show the hardware, benchmark it, choose when to work, sign in, and hand over
to the agent."""

from __future__ import annotations

import html
import time
from dataclasses import replace

from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QVBoxLayout,
    QWizard,
    QWizardPage,
)

from desktop.bench_result import BenchmarkResult
from desktop.control import ControlError, NotRunning
from desktop.gui.bridge import AgentBridge, Worker
from desktop.gui.icons import app_icon
from desktop.gui.policy_page import WorkPolicyPage
from desktop.gui.style import STYLE
from desktop.hardware import HardwareReport
from desktop.probe import probe


class MeasurePage(QWizardPage):
    """Detection and the benchmark run in a worker thread; Next unlocks when they are done."""

    def __init__(self, bridge: AgentBridge) -> None:
        super().__init__()
        self.bridge = bridge
        self.setTitle("Your hardware")
        # what is true of these figures: the agent registers with this very result (the same
        # cache), the market shows its fp32 figure, and billing takes the node's speed from
        # it, checked against what its tasks show (docs/money.md)
        self.setSubTitle(
            "GPUFlex measures what this computer can do, as gpuflex-node bench does. Your "
            "node offers these figures to the marketplace: buyers see its fp32 TFLOP/s beside "
            "your price, and work is paid by its speed, checked against what your tasks show."
        )
        lay = QVBoxLayout(self)
        self.text = QLabel("Detecting…")
        self.text.setWordWrap(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)  # busy
        lay.addWidget(self.text)
        lay.addWidget(self.bar)
        lay.addStretch(1)
        self.result: tuple[HardwareReport, BenchmarkResult] | None = None
        self._worker: Worker | None = None

    def initializePage(self) -> None:
        if self.result is not None:
            return
        paths = self.bridge.client.paths  # the agent's own folders: one benchmark cache

        def measure() -> tuple[HardwareReport, BenchmarkResult, bool]:
            # quick: the same matmul measurement as `gpuflex-node bench` (run_benchmark),
            # fewer training models; a result already cached for this hardware is reused
            hw, result, cached = probe(paths.cache, quick=True)
            assert result is not None  # measured: probe's default
            return hw, result, cached

        self._worker = Worker(measure, self)
        self._worker.done.connect(self._done)
        self._worker.failed.connect(lambda exc: self.text.setText(f"Measuring failed: {exc}"))
        self._worker.start()

    def _done(self, result: tuple[HardwareReport, BenchmarkResult, bool]) -> None:
        hw, bench, cached = result
        self.result = (hw, bench)
        self.bar.setRange(0, 1)
        self.bar.setValue(1)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(bench.created))
        note = f"Measured {when}" + (", earlier on this hardware." if cached else ".")
        self.text.setText(
            f"<pre>{html.escape(hw.summary())}\n\n{html.escape(bench.summary())}</pre><p>{note}</p>"
        )
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.result is not None


class AccountPage(QWizardPage):
    def __init__(self, bridge: AgentBridge) -> None:
        super().__init__()
        s = bridge.settings()
        self.setTitle("Sign in and set your price")
        self.setSubTitle("Your provider key is on the marketplace's account page.")
        form = QFormLayout(self)
        self.server = QLineEdit(s.server_url)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("gfx_u_…")
        self.name = QLineEdit(s.node_name)
        self.price = QDoubleSpinBox()
        self.price.setRange(0, 100)
        self.price.setSuffix(" credits per GPU hour")
        self.price.setValue(float(s.price_per_gpu_hour))
        form.addRow("Marketplace", self.server)
        form.addRow("Provider API key", self.key)
        form.addRow("Node name", self.name)
        form.addRow("Price", self.price)
        self.error = QLabel()
        self.error.setWordWrap(True)
        form.addRow(self.error)
        self.key.textChanged.connect(self.completeChanged)

    def isComplete(self) -> bool:
        return self.key.text().strip().startswith("gfx_u_")


class FirstRunWizard(QWizard):
    def __init__(self, bridge: AgentBridge) -> None:
        super().__init__()
        self.bridge = bridge
        self.setWindowTitle("Welcome to GPUFlex")
        self.setWindowIcon(app_icon())
        self.setStyleSheet(STYLE)
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.measure = MeasurePage(bridge)
        self.account = AccountPage(bridge)
        self.policy = WorkPolicyPage(bridge.settings())
        self.addPage(self.measure)
        self.addPage(self.policy)
        self.addPage(self.account)
        self.resize(620, 480)

    def accept(self) -> None:
        a = self.account
        s = replace(
            self.policy.applied(self.bridge.settings()),
            server_url=a.server.text().strip(),
            node_name=a.name.text().strip(),
            price_per_gpu_hour=f"{a.price.value():.2f}",
        )
        try:  # the agent signs in (desktop.config.sign_in), which marks the first run done
            self.bridge.save_settings(s, a.key.text().strip())
        except (ControlError, NotRunning) as exc:
            a.error.setText(str(exc))
            return
        super().accept()
