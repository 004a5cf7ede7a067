"""The status window: what the node is, what it is doing, what it has earned."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.agent import AgentStatus, LogEntry
from desktop.bench_result import BenchmarkResult
from desktop.gui.bridge import AgentBridge
from desktop.gui.icons import COLORS, LABELS, app_icon, state_pixmap
from desktop.gui.style import STYLE
from desktop.money import credits


def compact(v: float | None, unit: str = "") -> str:
    """1,450,000 -> 1.45M: figures that fit a card."""
    if v is None:
        return "n/a"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}{unit}"
    return f"{v:.3g}{unit}"


def benchmark_html(b: BenchmarkResult) -> str:
    t = b.matmul_tflops
    lines = [
        f"<b>{compact(t.get('fp32'))}</b> TFLOP/s fp32 · <b>{compact(t.get('bf16'))}</b> bf16"
        f" · <b>{compact(t.get('fp16'))}</b> fp16",
        f"Memory {compact(b.memory_gbps)} GB/s"
        + (f" · PCIe {compact(b.h2d_gbps)} / {compact(b.d2h_gbps)} GB/s" if b.h2d_gbps else ""),
        "Training " + " · ".join(f"{m} {compact(v)}/s" for m, v in b.train_samples_per_s.items()),
    ]
    ratio = b.peak_ratio.get("bf16") or b.peak_ratio.get("fp32")
    if ratio:
        lines.append(f"{ratio:.0%} of the published peak ({b.peak_source})")
    return lines[0] + "<br><span style='color:#6B7785'>" + "<br>".join(lines[1:]) + "</span>"


def card(title: str) -> tuple[QFrame, QVBoxLayout]:
    frame = QFrame()
    frame.setObjectName("card")
    lay = QVBoxLayout(frame)
    lay.setContentsMargins(16, 12, 16, 14)
    lay.setSpacing(6)
    head = QLabel(title.upper())
    head.setObjectName("cardTitle")
    lay.addWidget(head)
    return frame, lay


def _muted(text: str = "") -> QLabel:
    label = QLabel(text)
    label.setObjectName("muted")
    label.setWordWrap(True)
    return label


def runtime_fetch(runtime: dict[str, Any]) -> tuple[str, float] | None:
    """While the agent downloads its training runtime (desktop/runtime_keeper.py): the line
    the current-task card shows and the fraction done; None when nothing downloads."""
    fetch = runtime.get("fetch")
    if not isinstance(fetch, dict):
        return None
    got, total = float(fetch.get("bytes") or 0), float(fetch.get("total") or 0)
    done = min(got / total, 1.0) if total > 0 else 0.0
    size = f" of {total / 2**20:,.0f} MiB" if total > 0 else ""
    return f"Downloading the training runtime · {100 * done:.0f}%{size}", done


def runtime_line(runtime: dict[str, Any]) -> str:
    """Which runtime tasks train with: "cpu pack, torch 2.13.0" or "" before one is known."""
    if not runtime.get("plan"):
        return ""
    where = "pack" if runtime.get("source") == "pack" else "this environment"
    cuda = f", CUDA {runtime['cuda']}" if runtime.get("cuda") else ""
    return f"runtime {runtime['plan']} ({where}), torch {runtime.get('torch', '?')}{cuda}"


class StatusWindow(QWidget):
    def __init__(self, bridge: AgentBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setObjectName("page")
        self.setWindowTitle("GPUFlex")
        self.setWindowIcon(app_icon())
        self.setStyleSheet(STYLE)
        self.resize(760, 680)

        root = QVBoxLayout(self)
        root.setContentsMargins(20, 18, 20, 18)
        root.setSpacing(12)

        # header: state icon, name, state pill, pause button
        header = QHBoxLayout()
        self.state_icon = QLabel()
        header.addWidget(self.state_icon)
        titles = QVBoxLayout()
        title = QLabel("GPUFlex")
        title.setObjectName("title")
        titles.addWidget(title)
        self.reason = _muted()
        titles.addWidget(self.reason)
        header.addLayout(titles, 1)
        self.pill = QLabel()
        self.pill.setObjectName("pill")
        header.addWidget(self.pill, 0, Qt.AlignmentFlag.AlignVCenter)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setObjectName("primary")
        self.pause_button.clicked.connect(bridge.toggle_pause)
        header.addWidget(self.pause_button, 0, Qt.AlignmentFlag.AlignVCenter)
        root.addLayout(header)

        # earnings and counters
        row = QHBoxLayout()
        self.today = self._figure(row, "Earned today")
        self.total = self._figure(row, "Earned in total")
        self.tasks = self._figure(row, "Tasks this session")
        root.addLayout(row)

        # current task
        frame, lay = card("Current task")
        self.task_label = QLabel("No task right now")
        self.task_detail = _muted()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        lay.addWidget(self.task_label)
        lay.addWidget(self.progress)
        lay.addWidget(self.task_detail)
        self.lanes = _muted()  # each GPU's lane on a multi-GPU machine: what it does, or why not
        self.lanes.setWordWrap(True)
        self.lanes.setVisible(False)
        lay.addWidget(self.lanes)
        root.addWidget(frame)

        # hardware and benchmark side by side
        grid = QGridLayout()
        grid.setSpacing(12)
        frame, lay = card("Hardware")
        self.hardware = QLabel("Detecting…")
        self.hardware.setWordWrap(True)
        self.hardware.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.hardware)
        lay.addStretch(1)
        grid.addWidget(frame, 0, 0)
        frame, lay = card("Benchmark")
        self.bench = QLabel("Not measured yet")
        self.bench.setWordWrap(True)
        self.bench.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.bench)
        lay.addStretch(1)
        grid.addWidget(frame, 0, 1)
        root.addLayout(grid)

        frame, lay = card("Recent activity")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(300)
        self.log.setMinimumHeight(120)
        lay.addWidget(self.log)
        root.addWidget(frame, 1)

        bridge.status_changed.connect(self.update_status)
        bridge.log_added.connect(self.append_log)
        for entry in bridge.logs()[-100:]:
            self.append_log(entry)
        self.update_status(bridge.status)

    def _figure(self, row: QHBoxLayout, title: str) -> QLabel:
        frame, lay = card(title)
        value = QLabel("—")
        value.setObjectName("big")
        lay.addWidget(value)
        row.addWidget(frame)
        return value

    def update_status(self, st: AgentStatus) -> None:
        state = st.state.value
        self.state_icon.setPixmap(state_pixmap(state, 44))
        self.pill.setText(LABELS.get(state, state))
        self.pill.setStyleSheet(f"background: {COLORS.get(state, '#5B6B7F')};")
        self.reason.setText(st.reason or (f"Node {st.node_id} on {st.server}" if st.node_id
                                          else st.server))  # fmt: skip
        self.pause_button.setText("Resume" if st.paused else "Pause")
        self.today.setText(credits(st.earnings_today))
        self.total.setText(credits(st.earnings_total))
        self.tasks.setText(f"{st.completed}" + (f"  ·  {st.failed} failed" if st.failed else ""))
        fetching = runtime_fetch(st.runtime)
        if st.task is None and fetching is not None:  # first need: the pack downloads
            self.task_label.setText("Getting ready to train")
            self.task_detail.setText(fetching[0])
            self.progress.setValue(int(1000 * fetching[1]))
        elif st.task is None:
            self.task_label.setText("No task right now")
            self.task_detail.setText("")
            self.progress.setValue(0)
        else:
            t = st.task
            self.task_label.setText(f"Task {t.id[:16]}  ·  job {t.job_id[:24]}, round {t.round}")
            self.task_detail.setText(f"{t.phase.capitalize()} · {100 * t.progress:.0f}%")
            self.progress.setValue(int(1000 * t.progress))
        self.lanes.setText("\n".join(lane.line() for lane in st.lanes))
        self.lanes.setVisible(bool(st.lanes))
        if st.hardware is not None:
            hw = st.hardware
            gpus = (
                "".join(
                    f"<b>{g.name}</b><br>{g.memory_total_mb / 1024:.0f} GiB"
                    + (f", driver {g.driver}" if g.driver else "")
                    + "<br>"
                    for g in hw.gpus
                )
                or "<b>No GPU</b> — offering the CPU<br>"
            )
            sandbox = "bubblewrap sandbox" if st.isolated else "⚠ limits only (no bubblewrap)"
            self.hardware.setText(
                f"{gpus}<span style='color:#6B7785'>{hw.cpu_name}<br>{hw.cpu_threads} threads, "
                f"{hw.ram_total_mb / 1024:.0f} GiB RAM<br>torch {hw.torch_version} on "
                f"{hw.accelerator} · {sandbox}"
                + (f"<br>{line}" if (line := runtime_line(st.runtime)) else "")
                + "</span>"
            )
        if st.benchmark is not None:
            self.bench.setText(benchmark_html(st.benchmark))

    def append_log(self, entry: LogEntry) -> None:
        mark = {"warning": "⚠ ", "error": "✖ "}.get(entry.level, "")
        self.log.appendPlainText(f"{entry}".replace(" ", f" {mark}", 1) if mark else str(entry))
