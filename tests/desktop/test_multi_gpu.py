"""Every GPU in the machine (issue #17): one lane per GPU, each its own node, with its own
work policy, against a fake NVML that reports two GPUs (per-GPU processes, temperatures)."""

from __future__ import annotations

import datetime as dt
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_marketplace import digits_task
from test_agent_loop import make_agent, wait_for

from desktop import hardware, sandbox
from desktop.agent import AgentStatus, LaneStatus, State, TaskStatus
from desktop.config import Credentials, InvalidSettings, Settings, apply_changes
from desktop.hardware import AmdGpus, GpuInfo, HardwareReport
from desktop.journal import Journal
from desktop.lanes import lane_env, lane_hardware, lane_paths, plan_lanes
from desktop.mac_thermal import MacThermal, parse_pmset_therm, parse_thermal_state
from desktop.policy import Observations, WorkPolicy, decide, observe


def _gpu(index: int, backend: str = "cuda", vendor: str = "nvidia") -> GpuInfo:
    return GpuInfo(index=index, vendor=vendor, name=f"Fake RTX {index}", memory_total_mb=24576,
                   backend=backend, uuid=f"GPU-fake-{index}")  # fmt: skip


def _host(hw: HardwareReport, *gpus: GpuInfo) -> HardwareReport:
    return replace(hw, gpus=list(gpus), accelerator="cuda" if gpus else "cpu")


class FakeNvml:
    """NVML as desktop.hardware.Nvml answers it, for a machine with these GPUs."""

    available = True
    error = ""

    def __init__(self, n: int) -> None:
        self.temps = {i: 60.0 for i in range(n)}
        self.procs: dict[int, list[tuple[int, int]]] = {i: [] for i in range(n)}

    def start(self) -> bool:
        return True

    def count(self) -> int:
        return len(self.temps)

    def gpu(self, index: int) -> GpuInfo:
        return replace(_gpu(index), temperature_c=self.temps[index], utilization_pct=5.0,
                       memory_used_mb=300 * len(self.procs[index]))  # fmt: skip

    def processes(self, index: int) -> list[tuple[int, int]]:
        return list(self.procs[index])


@pytest.fixture
def nvml2(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(2)
    monkeypatch.setattr(hardware, "_NVML", fake)
    return fake


@pytest.fixture
def game() -> Any:
    """A program that is not GPUFlex's (a game, as far as the policy can tell)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


# ------------------------------------------------------------------------------ planning


def test_one_gpu_or_none_means_no_lanes_and_two_mean_one_each(hardware: HardwareReport):
    assert plan_lanes(_host(hardware)) is None  # CPU only: as always
    assert plan_lanes(_host(hardware, _gpu(0))) is None  # one GPU: as always
    mps = GpuInfo(index=0, vendor="apple", name="Apple GPU", memory_total_mb=16384, backend="mps")
    assert plan_lanes(replace(hardware, gpus=[mps], accelerator="mps")) is None
    two = _host(hardware, _gpu(0), _gpu(1))
    assert [g.index for g in plan_lanes(two) or []] == [0, 1]
    # the owner leaves GPU 0 out (the one the desktop runs on): GPU 1 alone works
    assert [g.index for g in plan_lanes(two, [0]) or []] == [1]
    assert plan_lanes(two, [0, 1]) == []
    # a GPU torch cannot use (a CPU build of torch) gets no lane
    blind = _host(hardware, _gpu(0, backend="none"), _gpu(1, backend="none"))
    assert plan_lanes(blind) is None


def test_a_lane_sees_only_its_gpu(hardware: HardwareReport, isolated_dirs):
    assert lane_env(_gpu(1)) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1",
                                 "GPUFLEX_DEVICE": ""}  # fmt: skip
    assert lane_env(_gpu(1, "rocm", "amd")) == {"HIP_VISIBLE_DEVICES": "1", "GPUFLEX_DEVICE": ""}
    two = _host(hardware, _gpu(0), _gpu(1))
    one = lane_hardware(two, 1)
    assert [g.index for g in one.gpus] == [1]
    assert one.fingerprint() != lane_hardware(two, 0).fingerprint()  # benchmarks cached apart
    # GPU 0's lane carries on the host's node and journal; the others have their own
    assert lane_paths(isolated_dirs, 0).journal == isolated_dirs.journal
    assert lane_paths(isolated_dirs, 1).journal != isolated_dirs.journal
    assert lane_paths(isolated_dirs, 0).cache != lane_paths(isolated_dirs, 1).cache


def test_excluded_gpus_are_checked():
    assert apply_changes(Settings(), {"excluded_gpus": [1, 3]}).excluded_gpus == [1, 3]
    for bad in ([-1], ["1"], [True], 1):
        with pytest.raises(InvalidSettings, match="excluded_gpus"):
            apply_changes(Settings(), {"excluded_gpus": bad})


# ------------------------------------------------------------------- busy and temperature


def test_each_gpu_is_observed_on_its_own(nvml2: FakeNvml, game):
    nvml2.procs[1] = [(game.pid, 2000)]
    nvml2.temps[1] = 88.0
    policy = WorkPolicy(idle_minutes=0)
    gpu0, gpu1 = observe(set(), 0), observe(set(), 1)
    assert gpu0.other_gpu_processes == [] and gpu0.gpu_temp_c == 60.0
    assert decide(policy, gpu0).allowed
    verdict = decide(policy, gpu1)
    assert not verdict.allowed
    assert "another program uses the GPU (sleep)" in verdict.reasons
    assert "GPU at 88 °C (limit 83 °C)" in verdict.reasons


class _FakeAmdGpu:
    def __init__(self, load: float, temp: float) -> None:
        self.load, self.temp = load, temp

    def query_load(self) -> float:
        return self.load

    def query_temperature(self) -> float:
        return self.temp

    def query_vram_usage(self) -> int:
        return 512 * 2**20


def test_an_amd_gpu_reports_its_load_and_temperature_through_pyamdgpuinfo():
    gpus = [_FakeAmdGpu(0.02, 51.0), _FakeAmdGpu(0.97, 70.0)]
    lib = SimpleNamespace(detect_gpus=lambda: len(gpus), get_gpu=gpus.__getitem__)
    amd = AmdGpus(lib)
    m0, m1 = amd.metrics(0), amd.metrics(1)
    assert (m0.utilization_pct, m0.temperature_c, m0.memory_used_mb) == (2.0, 51.0, 512)
    assert m1.other_processes is None  # pyamdgpuinfo lists no processes
    assert amd.metrics(2).temperature_c is None  # no such GPU: nothing known, nothing raised
    policy = WorkPolicy(idle_minutes=0)
    obs = [Observations(now=dt.datetime.now(), gpu_temp_c=m.temperature_c,
                        gpu_load_pct=m.utilization_pct, other_gpu_processes=None)
           for m in (m0, m1)]  # fmt: skip
    assert decide(policy, obs[0]).allowed
    assert decide(policy, obs[1]).reasons == ["another program keeps the GPU busy (97% load)"]
    # while its own task runs the load is the task's: only the temperature can stop it
    assert decide(policy, obs[1], working=True).allowed


# macOS 14 on an M2, idle and then under a long compile (recorded)
PMSET_COOL = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
Note: No CPU power status has been recorded
"""
PMSET_HOT = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
2024-05-02 14:11:09 +0200 CPU Power notify
\tCPU_Scheduler_Limit \t= 100
\tCPU_Available_CPUs \t= 8
\tCPU_Speed_Limit \t= 72
"""


def test_a_mac_that_is_hot_holds_work_back():
    assert parse_pmset_therm(PMSET_COOL) is None
    assert parse_pmset_therm(PMSET_HOT) == 72
    assert [parse_thermal_state(t) for t in ("0\n", "2\n", "3", "7", "")] == [
        "nominal", "serious", "critical", None, None]  # fmt: skip
    policy = WorkPolicy(idle_minutes=0)

    def verdict(thermal: MacThermal) -> list[str]:
        return decide(policy, Observations(now=dt.datetime.now(), mac_thermal=thermal)).reasons

    assert verdict(MacThermal("fair", None)) == []
    assert verdict(MacThermal("serious", 72)) == [
        "the Mac is hot (thermal state serious, CPU held to 72%)"]  # fmt: skip
    assert verdict(MacThermal(None, 72)) == ["the Mac is hot (CPU held to 72%)"]
    assert verdict(MacThermal(None, 100)) == []


@pytest.mark.macos
@pytest.mark.skipif(__import__("sys").platform != "darwin", reason="needs macOS")
def test_this_mac_says_how_hot_it_is():
    from desktop.mac_thermal import read

    assert read().state in ("nominal", "fair", "serious", "critical")


# ------------------------------------------------------------------------------ status


def test_the_status_carries_each_lane_through_the_local_api():
    task = TaskStatus("t-1", "job-1", 1, "training", 0.4, 0.0)
    st = AgentStatus(state=State.WORKING, lanes=(
        LaneStatus(0, "Fake RTX 0", State.WORKING, task=task, node_id="node-1"),
        LaneStatus(1, "Fake RTX 1", State.WAITING, "another program uses the GPU (game)"),
    ))  # fmt: skip
    back = AgentStatus.from_dict(st.to_dict())
    assert back.lanes == st.lanes
    assert [lane.line() for lane in back.lanes] == [
        "GPU 0 (Fake RTX 0): working, task t-1 training 40%",
        "GPU 1 (Fake RTX 1): waiting: another program uses the GPU (game)",
    ]
    assert AgentStatus.from_dict(AgentStatus().to_dict()).lanes == ()


# ------------------------------------------------------------------------ the agent itself


def test_a_game_on_gpu_1_pauses_only_gpu_1s_task(
    market, logged_in, isolated_dirs, fake_bench, hardware, nvml2, game, monkeypatch
):
    """Two lanes train at once, each its own node; a game starting on GPU 1 checkpoints GPU
    1's task through the pause path and holds that lane back, while GPU 0 works on."""
    monkeypatch.setattr(sandbox, "PAUSE_GRACE_S", 60.0)  # a hand-over test, not a speed test
    logged_in.idle_minutes = 0
    logged_in.task_wall_s = 1800  # two tasks share this machine's CPU: no time limit here
    two = _host(hardware, _gpu(0), _gpu(1))
    agent = make_agent(logged_in, isolated_dirs, fake_bench, hardware=two, policy_check_s=0.1)
    for tid in ("t-a", "t-b"):
        market.add(digits_task(tid, steps=400, rows=300))
    agent.start()
    try:
        wait_for(lambda: len(agent.status().lanes) == 2 and all(
            lane.task is not None and lane.task.phase == "training"
            for lane in agent.status().lanes), what="both GPUs training")  # fmt: skip
        on_gpu1 = agent.status().lanes[1].task
        assert on_gpu1 is not None
        nvml2.procs[1] = [(game.pid, 3000)]
        wait_for(lambda: agent.status().lanes[1].state is State.WAITING, what="GPU 1 held")
        lane1 = Journal(Path(isolated_dirs.data) / "gpu1" / "journal.jsonl", readonly=True)
        assert lane1.get(on_gpu1.id).state == "ready"  # kept, to go on after the game
        assert "GPU 1 waiting: another program uses the GPU (sleep)" in agent.status().reason
        assert on_gpu1.id not in market.accepted()
        nvml2.procs[1] = []
        # two tasks share this machine's CPU: the timeout only guards against a hang
        wait_for(lambda: {"t-a", "t-b"} <= market.accepted().keys(), 900, what="both updates")
        wait_for(lambda: agent.status().lanes[1].reason == "", what="GPU 1 free again")
    finally:
        agent.stop()
    messages = [e.message for e in agent.logs(500)]
    assert any(m.startswith(f"GPU 1: task {on_gpu1.id} interrupted") and "paused at a step"
               in m for m in messages), messages  # fmt: skip
    assert not any(m.startswith("GPU 0: task") and "interrupted" in m for m in messages)
    assert any(m.startswith("GPU 1: task") and "resuming after" in m for m in messages)
    assert sorted(market.puts) == [("t-a", 201), ("t-b", 201)]
    # each GPU registered as a node of its own, with that GPU's hardware only
    names = sorted(r["name"] for r in market.registrations)
    assert names == ["test-node-gpu0", "test-node-gpu1"]
    for reg in market.registrations:
        index = int(reg["name"][-1])
        assert [g["index"] for g in reg["hardware"]["gpus"]] == [index]
        assert reg["hardware"]["gpu_model"] == f"Fake RTX {index}"
    creds = Credentials(isolated_dirs)
    keys = {creds.node_key(market.url), creds.node_key(f"{market.url}#gpu1")}
    assert len(keys) == 2 and None not in keys
    # each lane's tasks saw only its own GPU
    assert agent._lanes[1]._sandbox.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert agent._lanes[0]._sandbox.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert agent.status().lanes == () or all(
        lane.state is State.STOPPED for lane in agent.status().lanes)  # fmt: skip


def test_an_excluded_gpu_is_never_lent(market, logged_in, isolated_dirs, fake_bench, hardware,
                                       nvml2):  # fmt: skip
    logged_in.excluded_gpus = [0]
    agent = make_agent(logged_in, isolated_dirs, fake_bench,
                       hardware=_host(hardware, _gpu(0), _gpu(1)))  # fmt: skip
    agent.start()
    try:
        wait_for(lambda: market.claims > 0, what="GPU 1 claiming")
        assert [lane.gpu for lane in agent.status().lanes] == [1]
    finally:
        agent.stop()
    assert [r["name"] for r in market.registrations] == ["test-node-gpu1"]


# ---------------------------------------------------------------------------- real GPUs


def _cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_gpus() < 2, reason="needs two or more NVIDIA GPUs")
def test_two_lanes_train_at_once_each_on_its_own_real_gpu(
    market, logged_in, isolated_dirs, fake_bench, hardware
):
    import os
    import sys

    lanes = plan_lanes(hardware) or []
    assert len(lanes) >= 2
    # what a lane's environment pins is the GPU NVML numbers so (CUDA's own order differs)
    code = "import torch; p = torch.cuda.get_device_properties(0); " \
           "print(torch.cuda.device_count(), p.uuid)"  # fmt: skip
    for gpu in lanes[:2]:
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **lane_env(gpu)},
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        assert out[0] == "1" and gpu.uuid.endswith(out[1]), (gpu, out)
    logged_in.idle_minutes = 0
    logged_in.pause_on_gpu_processes = False  # a shared test machine may run other GPU work
    logged_in.excluded_gpus = [g.index for g in hardware.gpus if g.index not in
                               (lanes[0].index, lanes[1].index)]  # fmt: skip
    agent = make_agent(logged_in, isolated_dirs, fake_bench, hardware=hardware)
    for tid in ("g-a", "g-b"):
        market.add(digits_task(tid, steps=3000, rows=300))
    agent.start()
    try:
        wait_for(lambda: len(agent.status().lanes) == 2 and all(
            lane.task is not None for lane in agent.status().lanes), 300,
            what="both GPUs working at once")  # fmt: skip
        wait_for(lambda: {"g-a", "g-b"} <= market.accepted().keys(), 600, what="both updates")
    finally:
        agent.stop()
    assert sorted(r["name"][-5:] for r in market.registrations) == sorted(
        f"-gpu{g.index}" for g in lanes[:2])  # fmt: skip
