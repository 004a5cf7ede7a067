"""A multi-GPU host's lanes: one Agent per GPU under the machine's one agent.

What a lane is, which GPUs get one and what pins a task to its GPU: desktop.lanes. This is
the host's side: it makes the lanes, runs them until the agent stops, and folds their
statuses into the host's one status (each GPU's line in `lanes`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from desktop import runtime_keeper
from desktop.agent_status import AgentStatus, Event, LaneStatus, State
from desktop.hardware import GpuInfo
from desktop.lanes import lane_hardware, lane_paths
from desktop.probe import probe

# the agent that wires this part (desktop.agent.Agent), named but not imported: the agent
# imports its parts, and a part importing it back, even for typing, is an import circle
Agent = Any


class LaneHost:
    """The lanes of one host agent (`node`): it makes one Agent per GPU (`lane` and `host`
    set), starts and stops them, and folds their statuses into the host's. The lanes
    themselves are the host agent's `_lanes` (pause, settings and login reach each of them
    from there)."""

    def __init__(self, node: Agent) -> None:
        self.node = node

    def run(self, gpus: list[GpuInfo]) -> None:
        """A multi-GPU host: one lane per GPU (desktop.lanes), each a node of its own with its
        own claim loop, sandbox and work policy, run until the agent stops. This agent keeps
        the one local API, settings, login, log and status, which lists each lane."""
        assert self.node._hardware is not None
        if not gpus:
            why = "every GPU is left out (excluded_gpus in the settings)"
            self.node._warn(f"nothing to do: {why}")
            self.node._set(state=State.WAITING, reason=why)
            self.node._stop.wait()
            return
        self.node._info(f"{len(gpus)} GPUs, each its own node: " + ", ".join(
            f"GPU {g.index} ({g.name})" for g in gpus))  # fmt: skip
        for gpu in gpus:
            paths = lane_paths(self.node.paths, gpu.index)
            bench = self.node._bench if self.node._bench_given else None
            if bench is None:
                self.node._info(f"GPU {gpu.index}: benchmarking it (cached after the first run)…")
                bench = probe(paths.cache, quick=True, measure=True, gpu=gpu,
                              packages=runtime_keeper.pack_packages(self.node))[1]  # fmt: skip
            lane = type(self.node)(  # an Agent, driving this one GPU
                self.node._settings, paths, credentials=self.node.credentials,
                hardware=lane_hardware(self.node._hardware, gpu.index), bench=bench,
                transport=self.node._transport, backoff=self.node._backoff,
                observe_fn=self.node._observe, claim_wait_s=self.node.claim_wait_s,
                idle_sleep_s=self.node.idle_sleep_s, policy_check_s=self.node.policy_check_s,
                lane=gpu, host=self.node,
            )  # fmt: skip
            lane.subscribe(self.on_event)
            if self.node._paused.is_set():
                lane._hold(self.node._pause_reason)
            self.node._lanes.append(lane)
        self.node._set(hardware=self.node._hardware, benchmark=self.node._bench)
        try:
            for lane in self.node._lanes:
                lane.start()
            while not self.node._stop.wait(2.0):
                self.node._write_status_file()
        finally:
            for lane in self.node._lanes:  # all at once: each may wait for its task to stop
                lane._stop.set()
                lane._wake.set()
            for lane in self.node._lanes:
                lane.stop()
            self.on_event(("state", None))

    @staticmethod
    def line(lane: Agent, st: AgentStatus) -> LaneStatus:
        """A lane's line in its host's status."""
        return LaneStatus(gpu=lane._gpu_index, gpu_name=lane._lane.name if lane._lane else "",
                          state=st.state, reason=st.reason, task=st.task, node_id=st.node_id,
                          completed=st.completed, failed=st.failed)  # fmt: skip

    def on_event(self, event: Event) -> None:
        kind = event[0]
        if kind == "state":
            self.node._set(**self.summary())
        elif kind == "task_done":
            self.node._emit(event)

    def summary(self) -> dict[str, Any]:
        """The host's status from its lanes': working while any works, paused or waiting
        when all are; the reason names each GPU that is not working, and why."""
        sts = [lane.status() for lane in self.node._lanes]
        lanes = tuple(self.line(lane, st) for lane, st in zip(self.node._lanes, sts, strict=True))
        states = {lane.state for lane in lanes}
        if State.WORKING in states:
            state = State.WORKING
        elif State.ERROR in states:
            state = State.ERROR
        elif states <= {State.PAUSED}:
            state = State.PAUSED
        elif states <= {State.PAUSED, State.WAITING}:
            state = State.WAITING
        elif State.STARTING in states:
            state = State.STARTING
        elif states <= {State.STOPPED}:
            state = State.STOPPED
        else:
            state = State.IDLE
        held = [lane for lane in lanes if lane.reason and lane.state is not State.WORKING]
        reasons = {lane.reason for lane in held}
        if len(reasons) == 1 and len(held) == len(lanes):
            reason = held[0].reason  # the same for every GPU (paused by you, on battery)
        else:
            reason = "; ".join(f"GPU {lane.gpu} {lane.state.value}: {lane.reason}" for lane in held)
        task = next((lane.task for lane in lanes if lane.task is not None), None)
        money = [sum(Decimal(getattr(st, f"earnings_{k}") or "0") for st in sts)
                 for k in ("today", "total")]  # fmt: skip
        return {
            "state": state, "reason": reason, "task": task, "lanes": lanes,
            "node_id": ", ".join(lane.node_id for lane in lanes if lane.node_id),
            "registered": all(st.registered for st in sts),
            "isolated": all(st.isolated for st in sts),
            "completed": sum(lane.completed for lane in lanes),
            "failed": sum(lane.failed for lane in lanes),
            "earnings_today": f"{money[0]:.2f}", "earnings_total": f"{money[1]:.2f}",
            "network": sts[0].network if sts else {},
            "last_error": next((st.last_error for st in sts if st.last_error), ""),
        }  # fmt: skip
