"""GPUFlex's own processes never count as "another program uses the GPU"; a game still does."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from desktop.hardware import Nvml, gpu_metrics
from desktop.own_processes import ProcessInfo, foreign, is_gpuflex_cmdline, is_gpuflex_process
from desktop.policy import Observations, WorkPolicy, decide


@pytest.mark.parametrize(
    "cmdline",
    [
        ["/home/me/.venv/bin/python3", "/home/me/.venv/bin/gpuflex", "demo"],
        ["/opt/gpuflex/gpuflex-node", "run"],
        ["C:\\Program Files\\GPUFlex\\GPUFlex.exe"],
        ["python3", "-m", "desktop.task_runner", "/tasks/t1"],
        ["python", "-X", "utf8", "-m", "marketplace.cli", "worker"],
        ["python3.12", "-mdesktop.cli", "run"],
        ["/usr/bin/python3", "-u", "/usr/local/bin/gpuflex-tray"],
    ],
)
def test_gpuflex_programs_are_recognised(cmdline: list[str]) -> None:
    assert is_gpuflex_cmdline(cmdline)


@pytest.mark.parametrize(
    "cmdline",
    [
        ["C:\\Games\\game.exe", "--gpuflex"],
        ["python3", "train.py", "gpuflex-node"],
        ["python3", "-c", "import desktop.cli"],
        ["python3", "-m", "torch.distributed.run", "desktop.cli"],
        ["blender", "-b", "scene.blend"],
        [],
    ],
)
def test_other_programs_are_not(cmdline: list[str]) -> None:
    assert not is_gpuflex_cmdline(cmdline)


def test_descendants_of_gpuflex_are_gpuflex_and_loops_end() -> None:
    table = {
        10: ProcessInfo(10, 1, ("/usr/bin/gpuflex-node", "run")),
        11: ProcessInfo(11, 10, ("bwrap", "--unshare-all", "--", "python3", "x")),
        12: ProcessInfo(12, 11, ("python3", "/tmp/x.py")),
        20: ProcessInfo(20, 1, ("steam",)),
        21: ProcessInfo(21, 20, ("game.exe",)),
        30: ProcessInfo(30, 31, ("a",)),
        31: ProcessInfo(31, 30, ("b",)),  # a cycle (pid reuse) must not hang
    }
    procs = [(12, 900), (21, 4000), (30, 1), (99, 5)]
    # a process that cannot be read (another user's) is someone else's: stay polite
    assert foreign(procs, lookup=table.get) == [(21, 4000), (30, 1), (99, 5)]
    assert is_gpuflex_process(11, table.get) and not is_gpuflex_process(99, table.get)


def _fake_nvml(pids: list[int]) -> Nvml:
    fake = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * 2**30, used=9 * 2**30),
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlSystemGetDriverVersion=lambda: "580.159",
        nvmlDeviceGetUUID=lambda h: "GPU-h100",
        nvmlDeviceGetTemperature=lambda h, s: 40,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=90),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in pids
        ],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )
    nv = Nvml()
    nv._started, nv.available, nv._nv = True, True, fake
    return nv


def _wait_for_children(proc: subprocess.Popen, n: int) -> list[psutil.Process]:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError("the child process did not start")


def test_real_process_tree_on_a_scripted_gpu(tmp_path: Path) -> None:
    """Real processes, a scripted NVML: a `gpuflex-*` program and the task it started hold
    the GPU beside a game; only the game makes the policy wait, named in the reason."""
    child = "import time; time.sleep(60)"
    agent = tmp_path / "gpuflex-agent-under-test"
    agent.write_text(
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "time.sleep(60)\n"
    )
    game = tmp_path / "game.py"
    game.write_text("import time; time.sleep(60)\n")
    procs = [subprocess.Popen([sys.executable, str(agent)]),
             subprocess.Popen([sys.executable, str(game)])]  # fmt: skip
    try:
        task = _wait_for_children(procs[0], 1)[0]
        holders = [procs[0].pid, task.pid, procs[1].pid]
        m = gpu_metrics(0, nv=_fake_nvml(holders))
        assert m.other_processes == [(procs[1].pid, 1024)]
        obs = Observations(now=dt.datetime.now(), other_gpu_processes=m.other_processes)
        decision = decide(WorkPolicy(), obs)
        assert not decision.allowed
        game_name = psutil.Process(procs[1].pid).name()
        assert str(decision) == f"another program uses the GPU ({game_name})"
        # without the game, GPUFlex's own processes alone never make it wait
        alone = gpu_metrics(0, nv=_fake_nvml(holders[:2]))
        assert alone.other_processes == []
        assert decide(WorkPolicy(), Observations(now=obs.now, other_gpu_processes=[])).allowed
    finally:
        for p in procs:
            for kid in psutil.Process(p.pid).children(recursive=True):
                kid.kill()
            p.kill()
            p.wait()


def test_a_foreign_gpu_process_is_explained_once_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the work policy pauses for can be traced from the agent's log: the pid's ancestry,
    and where the walk stopped; each pid once, however often the GPU is sampled."""
    table = {
        7001: ProcessInfo(7001, 7000, ("python3", "-c", "import torch")),
        7000: ProcessInfo(7000, 6999, ("bash", "run.sh")),
        # 6999 cannot be read (another pid namespace, or gone)
    }
    with caplog.at_level("INFO", logger="desktop.own_processes"):
        assert foreign([(7001, 512)], lookup=table.get) == [(7001, 512)]
        assert foreign([(7001, 512)], lookup=table.get) == [(7001, 512)]
        assert foreign([(424242, 64)], lookup=table.get) == [(424242, 64)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "7001:python3 -c import torch <- 7000:bash run.sh" in lines[0]
    assert "its parent 6999 cannot be read" in lines[0]
    assert "pid 424242 cannot be read here" in lines[1]
