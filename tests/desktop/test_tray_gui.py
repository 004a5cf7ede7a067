"""The tray app's real widgets, offscreen, as clients of a live agent's local API (a daemon
on a real Unix socket) against the test marketplace."""

from __future__ import annotations

import plistlib
from pathlib import Path

import pytest
from fake_marketplace import digits_task
from PySide6.QtCore import Qt

from desktop import autostart
from desktop.agent import Agent, State
from desktop.client import Backoff
from desktop.config import Credentials, load_settings
from desktop.control import ControlClient
from desktop.daemon import Daemon
from desktop.gui.bridge import AgentBridge
from desktop.gui.first_run import FirstRunWizard
from desktop.gui.settings_dialog import SettingsDialog
from desktop.gui.status_window import StatusWindow
from desktop.gui.tray import TrayController


@pytest.fixture
def live(qtbot, market, logged_in, isolated_dirs, fake_bench):
    daemon = Daemon.open(isolated_dirs, lambda: Agent(
        logged_in, isolated_dirs, bench=fake_bench, claim_wait_s=1, idle_sleep_s=0.1,
        backoff=Backoff(base_s=0.05, cap_s=0.3)))  # fmt: skip
    daemon.api.start()  # the agent itself starts in each test (daemon.agent.start())
    bridge = AgentBridge(ControlClient(isolated_dirs), poll_ms=50)
    yield daemon.agent, bridge
    bridge.close()
    daemon.close()
    bridge.deleteLater()


def test_pause_and_resume_through_the_widgets(qtbot, live) -> None:
    agent, bridge = live
    window = StatusWindow(bridge)
    qtbot.addWidget(window)
    tray = TrayController(bridge, parent=bridge)
    agent.start()
    qtbot.waitUntil(lambda: agent.status().state is State.IDLE, timeout=60_000)
    qtbot.mouseClick(window.pause_button, Qt.MouseButton.LeftButton)
    assert agent.status().state is State.PAUSED
    qtbot.waitUntil(lambda: window.pause_button.text() == "Resume", timeout=5_000)
    assert tray.pause_action.text() == "Resume"
    assert window.pill.text() == "Paused"
    tray.pause_action.trigger()  # the tray menu's item does the same
    assert agent.status().state is not State.PAUSED
    qtbot.waitUntil(lambda: window.pause_button.text() == "Pause", timeout=5_000)


def test_status_window_follows_a_running_task(qtbot, live, market) -> None:
    agent, bridge = live
    window = StatusWindow(bridge)
    qtbot.addWidget(window)
    market.earnings = {"today": "0.12", "total": "3.40"}
    market.add(digits_task("gui-1", steps=1200, rows=300))
    seen: list[int] = []
    window.progress.valueChanged.connect(seen.append)
    agent.start()
    qtbot.waitUntil(lambda: "gui-1" in window.task_label.text(), timeout=60_000)
    qtbot.waitUntil(lambda: 0 < window.progress.value() < 1000, timeout=60_000)
    assert "Training" in window.task_detail.text()
    qtbot.waitUntil(lambda: "gui-1" in market.accepted(), timeout=90_000)
    qtbot.waitUntil(lambda: window.task_label.text() == "No task right now", timeout=10_000)
    qtbot.waitUntil(lambda: window.total.text() == "3.40 credits", timeout=10_000)
    assert window.tasks.text().startswith("1")
    assert "uploaded" in window.log.toPlainText()
    assert any(0 < v < 1000 for v in seen)


def test_settings_dialog_persists(qtbot, live, isolated_dirs, monkeypatch) -> None:
    agent, bridge = live
    dialog = SettingsDialog(bridge)
    qtbot.addWidget(dialog)
    dialog.price.setValue(0.75)
    dialog.idle.setValue(7)
    dialog.use_schedule.setChecked(True)
    dialog.battery.setChecked(True)
    dialog.mem.setValue(2048)
    dialog.busy.setValue(50)
    dialog.autostart.setChecked(True)
    dialog.key.setText("gfx_u_newkey")
    dialog.accept()
    saved = load_settings(isolated_dirs)
    assert saved.price_per_gpu_hour == "0.75" and saved.idle_minutes == 7
    assert (saved.schedule_start, saved.schedule_end) == ("22:00", "07:00")
    assert saved.work_on_battery and saved.task_memory_mb == 2048 and saved.start_at_login
    assert saved.max_gpu_busy_pct == 50
    assert agent.settings == saved
    assert Credentials(isolated_dirs).provider_key() == "gfx_u_newkey"
    assert autostart.is_enabled("linux")
    # reopening shows what was saved
    again = SettingsDialog(bridge)
    qtbot.addWidget(again)
    assert again.price.value() == 0.75 and again.idle.value() == 7
    again.autostart.setChecked(False)
    again.accept()
    assert not autostart.is_enabled("linux")


def test_first_run_measures_then_saves_the_account(qtbot, live, isolated_dirs) -> None:
    _agent, bridge = live
    wizard = FirstRunWizard(bridge)
    qtbot.addWidget(wizard)
    wizard.show()
    qtbot.waitUntil(wizard.measure.isComplete, timeout=120_000)
    assert "TFLOP/s" in wizard.measure.text.text()
    wizard.next()
    # when to work: "only when idle" is the default; the owner picks "always" and a cap
    policy = wizard.policy
    assert wizard.currentPage() is policy
    assert policy.idle_only.isChecked() and policy.idle.value() == 5 and policy.idle.isEnabled()
    policy.always.setChecked(True)
    assert not policy.idle.isEnabled()
    policy.busy.setValue(60)
    policy.use_schedule.setChecked(True)
    wizard.next()
    assert not wizard.account.isComplete()
    wizard.account.key.setText("gfx_u_firstrun")
    wizard.account.name.setText("my-desktop")
    assert wizard.account.isComplete()
    wizard.accept()
    saved = load_settings(isolated_dirs)
    assert saved.first_run_done and saved.node_name == "my-desktop"
    assert saved.idle_minutes == 0 and saved.max_gpu_busy_pct == 60
    assert (saved.schedule_start, saved.schedule_end) == ("22:00", "07:00")
    assert Credentials(isolated_dirs).provider_key() == "gfx_u_firstrun"


def test_two_trays_attach_and_closing_one_leaves_the_work_going(qtbot, live,
                                                               isolated_dirs) -> None:  # fmt: skip
    agent, first = live
    second = AgentBridge(ControlClient(isolated_dirs), poll_ms=50)
    tray1 = TrayController(first, parent=first)
    tray2 = TrayController(second, parent=second)
    agent.start()
    ready = "GPUFlex — Ready, waiting for work"
    qtbot.waitUntil(lambda: tray2.status_action.text() == ready, timeout=60_000)
    with qtbot.waitSignal(first.stopped, timeout=10_000):
        tray1.quit_action.trigger()  # "Close this tray (work goes on)"
    assert agent.running and agent.status().state is State.IDLE
    tray2.pause_action.trigger()  # the other tray still drives the same agent
    assert agent.status().state is State.PAUSED
    qtbot.waitUntil(lambda: tray2.pause_action.text() == "Resume", timeout=10_000)
    assert "Earned 0.00 credits today" in tray2.earnings_action.text()
    tray2.stop_action.trigger()  # stopping the agent is its own, explicit item
    qtbot.waitUntil(lambda: not agent.running, timeout=60_000)
    second.close()


def test_autostart_files(tmp_path: Path, monkeypatch) -> None:
    path = autostart.enable("linux")
    text = Path(path).read_text()
    assert "[Desktop Entry]" in text and "desktop.gui.app" in text
    autostart.disable("linux")
    assert not Path(path).exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    plist = plistlib.loads(Path(autostart.enable("darwin")).read_bytes())
    assert plist["RunAtLoad"] and plist["Label"] == autostart.APP_ID
    assert autostart.is_enabled("darwin")


def test_screenshots_are_written(qtbot, tmp_path: Path) -> None:
    from desktop.gui import screenshots

    assert screenshots.main([str(tmp_path)]) == 0
    for name in ("status-window.png", "tray-menu.png", "settings.png"):
        assert (tmp_path / name).stat().st_size > 5_000
    # the pictures show this machine, measured, and say which parts are an example
    from desktop.hardware import detect

    hw = detect()
    caption = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert hw.cpu_name in caption and "example snapshot" in caption
    if hw.primary_gpu is None:  # no invented GPU on a machine without one
        assert "no GPU" in caption and "RTX" not in caption


def test_notifications_for_finished_tasks_and_errors(qtbot, live) -> None:
    agent, bridge = live
    with qtbot.waitSignal(bridge.notify, timeout=10_000) as done:
        agent._set(completed=1)
    assert done.args == ["Task finished", "1 more task(s) uploaded; 1 this session."]
    with qtbot.waitSignal(bridge.notify, timeout=10_000) as failed:
        agent._error("task t-y failed (oom): too big")
    assert failed.args[0] == "GPUFlex: problem" and "oom" in failed.args[1]


def test_the_tray_starts_the_service_and_a_second_attaches(qtbot, isolated_dirs,
                                                           fake_bench) -> None:  # fmt: skip
    """A real `gpuflex-node run` process, spawned detached as the tray does when no service
    runs; both trays attach to it, and closing them leaves it running."""
    import contextlib
    import os
    import signal

    from desktop.bench_result import save_cached
    from desktop.control import ensure_running

    save_cached(isolated_dirs.cache, fake_bench)  # the spawned agent skips the benchmark
    client = ensure_running(isolated_dirs, wait_s=120)
    pid = client.status()["pid"]
    try:
        assert pid != os.getpid()
        first = AgentBridge(ControlClient(isolated_dirs), poll_ms=50)
        second = AgentBridge(ensure_running(isolated_dirs), poll_ms=50)  # attaches, no spawn
        assert first.agent_pid == second.agent_pid == pid
        first.close()
        second.pause("test")
        qtbot.waitUntil(lambda: second.status.reason == "paused by you: test", timeout=30_000)
        second.close()
        assert client.status()["pid"] == pid  # no tray left, the agent still serves
        client.stop()
        qtbot.waitUntil(lambda: not client.running(), timeout=90_000)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_the_datasets_page_declares_and_removes(qtbot, live, isolated_dirs, tmp_path) -> None:
    """The settings' Datasets tab, through the agent's /datasets; a dialog saved after a
    declaration keeps it (the other tabs never send local_datasets)."""
    agent, bridge = live
    table = tmp_path / "clinic.csv"
    table.write_text("a,b,label\n1.5,2,0\n2.5,1,1\n3.5,0,0\n4.5,1,1\n5.5,2,1\n")
    dialog = SettingsDialog(bridge)
    qtbot.addWidget(dialog)
    page = dialog.datasets
    assert page.declare("clinic", str(table))
    assert page.list.count() == 1 and page.list.item(0).text().startswith("clinic — csv, 5 rows")
    assert not page.declare("clinic", str(table)) and "already declared" in page.error.text()
    dialog.price.setValue(0.5)
    dialog.accept()
    saved = load_settings(isolated_dirs)
    assert saved.price_per_gpu_hour == "0.50" and [d["name"] for d in saved.local_datasets] == [
        "clinic"
    ]
    page.list.setCurrentRow(0)
    page.remove.click()
    assert page.list.count() == 0 and agent.datasets() == []


def test_the_tray_and_window_say_which_gpu_waits_and_why(qtbot, live) -> None:
    """A multi-GPU machine (desktop.lanes): a line per GPU in the tray menu, its tooltip and
    the status window, through the local API."""
    from desktop.agent import LaneStatus

    agent, bridge = live
    window = StatusWindow(bridge)
    qtbot.addWidget(window)
    tray = TrayController(bridge, parent=bridge)
    agent._set(state=State.IDLE, lanes=(
        LaneStatus(0, "RTX 4090", State.IDLE, node_id="node-1"),
        LaneStatus(1, "RTX 3080", State.WAITING, "another program uses the GPU (game.exe)"),
    ))  # fmt: skip
    waiting = "GPU 1 (RTX 3080): waiting: another program uses the GPU (game.exe)"
    qtbot.waitUntil(lambda: len(tray.lane_actions) == 2, timeout=10_000)
    assert [a.text() for a in tray.lane_actions] == ["GPU 0 (RTX 4090): idle", waiting]
    assert waiting in tray.tray.toolTip()
    assert waiting in window.lanes.text() and not window.lanes.isHidden()
    agent._set(lanes=())  # one GPU again: no lines
    qtbot.waitUntil(lambda: not any(a.isVisible() for a in tray.lane_actions), timeout=10_000)
    assert window.lanes.isHidden()


def test_the_owner_keeps_a_gpu_back_in_the_settings(qtbot, live, isolated_dirs, hardware) -> None:
    """Several GPUs: a box per GPU in Limits; one left unticked is saved in excluded_gpus."""
    from dataclasses import replace

    from desktop.hardware import GpuInfo

    agent, bridge = live
    gpus = [GpuInfo(index=i, vendor="nvidia", name=f"RTX {i}", memory_total_mb=8192,
                    backend="cuda") for i in (0, 1)]  # fmt: skip
    agent._set(state=State.IDLE, hardware=replace(hardware, gpus=gpus))
    qtbot.waitUntil(lambda: bridge.status.hardware is not None
                    and len(bridge.status.hardware.gpus) == 2, timeout=10_000)  # fmt: skip
    dialog = SettingsDialog(bridge)
    qtbot.addWidget(dialog)
    assert sorted(dialog.lend) == [0, 1] and all(b.isChecked() for b in dialog.lend.values())
    dialog.lend[0].setChecked(False)
    dialog.accept()
    assert load_settings(isolated_dirs).excluded_gpus == [0]
    again = SettingsDialog(bridge)
    qtbot.addWidget(again)
    assert not again.lend[0].isChecked() and again.lend[1].isChecked()


def test_the_tray_says_what_waits_out_the_payout_hold(qtbot, live) -> None:
    """Earnings of unverified work are held by the server (docs/money.md, payout holds): the
    tray's earnings line says how much, through the local API, and nothing while none is."""
    agent, bridge = live
    tray = TrayController(bridge, parent=bridge)
    agent._set(earnings_today="0.25", earnings_total="1.50", earnings_held="0.75")
    qtbot.waitUntil(lambda: "on hold" in tray.earnings_action.text(), timeout=10_000)
    assert tray.earnings_action.text().endswith("1.50 credits in total · 0.75 credits on hold")
    agent._set(earnings_held="0.000000")  # released
    qtbot.waitUntil(lambda: "on hold" not in tray.earnings_action.text(), timeout=10_000)
