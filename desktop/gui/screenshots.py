"""Render the tray menu, status window and settings dialog to PNGs (offscreen), for docs/.

    QT_QPA_PLATFORM=offscreen python -m desktop.gui.screenshots [docs/screenshots]

The windows are the real widgets attached to a real local API (desktop.local_api), served
by an agent that is never started. Its hardware and benchmark are the machine's that renders
them, detected and measured as the agent does (desktop.probe); the task it trains, its
earnings and its log are an example snapshot, since no marketplace is involved. The folder's
README.md, written beside the pictures, says so and names the machine.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from desktop.agent import Agent, AgentStatus, LogEntry, State, TaskStatus
from desktop.bench_result import BenchmarkResult
from desktop.config import Credentials, Paths, Settings
from desktop.hardware import HardwareReport
from desktop.probe import probe


def demo_status(hw: HardwareReport, bench: BenchmarkResult) -> AgentStatus:
    """This machine's hardware and benchmark, and an example task and earnings."""
    task = TaskStatus("c0ffee42d00d", "digits-cnn-7f3a", 12, "training", 0.62, time.time() - 95)
    # fmt: off
    return AgentStatus(
        state=State.WORKING, task=task,
        server="https://market.gpuflex.io", node_id="node-2841", registered=True,
        earnings_today="0.000842", earnings_total="0.0316", completed=23, isolated=True,
        hardware=hw, benchmark=bench,
    )
    # fmt: on


def caption(hw: HardwareReport, bench: BenchmarkResult) -> str:
    """The pictures' README: what in them is measured and what is an example."""
    when = time.strftime("%Y-%m-%d", time.localtime())
    gpu = hw.primary_gpu.name if hw.primary_gpu else "no GPU"
    return (
        "# The contributor app's windows\n\n"
        "Rendered by `make screenshots` (`python -m desktop.gui.screenshots`) on "
        f"{when}, offscreen, with the real widgets and local API. The hardware and benchmark "
        f"they show are the rendering machine's own, detected and measured as the agent does: "
        f"{hw.cpu_name}, {gpu}; fp32 {bench.matmul_tflops.get('fp32') or 0:.3g} TFLOP/s on "
        f"{bench.device_name}. The task in training, the earnings and the log lines are an "
        "example snapshot: no marketplace was involved.\n"
    )


DEMO_LOG = [
    "GPUFlex agent 0.1.0 starting; marketplace https://market.gpuflex.io",
    "benchmark loaded from cache",
    "task 9ab1e3 uploaded",
    "claimed task c0ffee42d00d (job digits-cnn-7f3a, round 12)",
    "training task c0ffee42d00d (attempt 1)",
]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    out = Path((argv or sys.argv[1:] or ["docs/screenshots"])[0])
    out.mkdir(parents=True, exist_ok=True)

    from PySide6.QtWidgets import QApplication

    from desktop.control import ControlClient
    from desktop.gui.bridge import AgentBridge
    from desktop.gui.settings_dialog import SettingsDialog
    from desktop.gui.tray import TrayController
    from desktop.local_api import LocalApi

    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(Path(tmp) / "c", Path(tmp) / "d", Path(tmp) / "k")
        hw, bench, _ = probe(paths.cache, quick=True)  # this machine, measured in a child
        assert bench is not None
        settings = Settings(server_url="https://market.gpuflex.io", node_name="my-computer",
                            price_per_gpu_hour="0.45", idle_minutes=5, schedule_start="22:00",
                            schedule_end="08:00", start_at_login=True)  # fmt: skip
        Credentials(paths, use_keyring=False).set_provider_key("gfx_u_demo")
        agent = Agent(settings, paths, credentials=Credentials(paths, use_keyring=True))
        status = demo_status(hw, bench)
        agent._status = status  # a demo snapshot; the agent itself is never started
        base = time.time() - 300
        for i, line in enumerate(DEMO_LOG):
            agent._log.append(LogEntry(base + 60 * i, "info", line, i + 1))
        api = LocalApi(agent).start()
        bridge = AgentBridge(ControlClient(paths))
        tray = TrayController(bridge)
        window = tray.show_window()
        app.processEvents()
        window.grab().save(str(out / "status-window.png"))

        tray.menu.adjustSize()
        tray.menu.ensurePolished()
        tray.menu.grab().save(str(out / "tray-menu.png"))

        dialog = SettingsDialog(bridge)
        dialog.show()
        app.processEvents()
        dialog.grab().save(str(out / "settings.png"))
        dialog.tabs.setCurrentIndex(1)
        app.processEvents()
        dialog.grab().save(str(out / "settings-schedule.png"))
        dialog.close()
        window.close()
        bridge.close()
        api.close()
    (out / "README.md").write_text(caption(hw, bench), encoding="utf-8")
    for name in ("status-window.png", "tray-menu.png", "settings.png", "settings-schedule.png",
                 "README.md"):  # fmt: skip
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
