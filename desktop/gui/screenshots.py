"""Render the tray menu, status window and settings dialog to PNGs (offscreen), for docs/.

    QT_QPA_PLATFORM=offscreen python -m desktop.gui.screenshots [docs/screenshots]

The windows are the real widgets attached to a real local API (desktop.local_api), served
by an agent that is never started and holds a demo status (an RTX 4090 node mid-task), so
the pictures show the product as an owner sees it rather than this GPU-less build machine.
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
from desktop.hardware import GpuInfo, HardwareReport


def demo_status() -> AgentStatus:
    hw = HardwareReport(
        cpu_name="AMD Ryzen 9 7950X 16-Core Processor", cpu_cores=16, cpu_threads=32,
        ram_total_mb=65536, os="Linux 6.8", python="3.11.7", torch_version="2.13.0",
        torch_cuda="12.8", accelerator="cuda",
        gpus=[GpuInfo(0, "nvidia", "NVIDIA GeForce RTX 4090", 24564, "cuda", driver="570.86",
                      compute_capability="8.9", temperature_c=64.0, utilization_pct=97.0)],
    )  # fmt: skip
    bench = BenchmarkResult(
        fingerprint="demo", device="cuda:0", device_name="NVIDIA GeForce RTX 4090", quick=False,
        matmul_tflops={"fp32": 71.8, "fp16": 151.2, "bf16": 149.7}, memory_gbps=912.4,
        h2d_gbps=24.6, d2h_gbps=26.1,
        train_samples_per_s={"mlp": 1_450_000.0, "cnn": 212_000.0, "transformer": 48_300.0},
        peak_ratio={"fp32": 0.87, "fp16": 0.92, "bf16": 0.91}, peak_source="RTX 4090",
    )  # fmt: skip
    task = TaskStatus("c0ffee42d00d", "digits-cnn-7f3a", 12, "training", 0.62, time.time() - 95)
    # fmt: off
    return AgentStatus(
        state=State.WORKING, task=task,
        server="https://market.gpuflex.io", node_id="node-2841", registered=True,
        earnings_today="1.84", earnings_total="57.20", completed=23, isolated=True,
        hardware=hw, benchmark=bench,
    )
    # fmt: on


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
        settings = Settings(server_url="https://market.gpuflex.io", node_name="studio-4090",
                            price_per_gpu_hour="0.45", idle_minutes=5, schedule_start="22:00",
                            schedule_end="08:00", start_at_login=True)  # fmt: skip
        Credentials(paths, use_keyring=False).set_provider_key("gfx_u_demo")
        agent = Agent(settings, paths, credentials=Credentials(paths, use_keyring=True))
        status = demo_status()
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
    for name in ("status-window.png", "tray-menu.png", "settings.png", "settings-schedule.png"):
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
