"""Presence: how one node (an agent, or one GPU's lane of a multi-GPU host) registers with the
marketplace and keeps its heartbeat.

    presence = Presence(agent)      # the agent (desktop.agent) it speaks for
    presence.register()             # once per server: waits for a login, stores the node key
    presence.probe_link()           # the link timed both ways before the first heartbeat
    presence.run()                  # heartbeats until the agent stops (its own thread)
    presence.beat()                 # one heartbeat; last_beat says when, and whether it failed

The node's status, log, credentials, client and journal stay the agent's; presence holds the
heartbeat's interval (the marketplace sets it) and its last outcome (the local API's /readyz).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from desktop import local_datasets
from desktop.agent_status import State
from desktop.client import ApiError, Stopped, Unavailable
from desktop.config import Settings
from desktop.hardware import HardwareReport, gpu_metrics
from desktop.lanes import lane_name
from desktop.netprobe import NetworkFigures

# the agent that wires this part (desktop.agent.Agent), named but not imported: the agent
# imports its parts, and a part importing it back, even for typing, is an import circle
Agent = Any

log = logging.getLogger("gpuflex.agent")

HEARTBEAT_TASKS = 32  # the most task_ids a heartbeat names (docs/agent-api.md)
LINK_PROBE_BYTES = 32 * 1024  # times a 0.3 Mbit/s link in about a second (desktop.netprobe)
HEARTBEAT_S = 10.0  # until the marketplace says otherwise (heartbeat_interval_s)


def registration_hardware(hw: HardwareReport, s: Settings, isolated: bool) -> dict[str, Any]:
    """The hardware report plus the summary fields the marketplace schedules on: `gpu_model`,
    `memory_gb` (the GPU's memory, or for a CPU node the RAM a task may use) and `isolation`
    (whether this node's sandbox confines a task, or only limits it: a job may require
    `isolation: full`)."""
    gpu = hw.primary_gpu if hw.accelerator != "cpu" else None
    memory_mb = gpu.memory_total_mb if gpu else min(hw.ram_total_mb, s.task_memory_mb)
    return {
        **hw.to_dict(),
        "gpu_model": gpu.name if gpu else "",
        "memory_gb": round(memory_mb / 1024, 2),
        "accelerator": hw.accelerator,
        "isolation": "full" if isolated else "limits",
    }


class Presence:
    """Registration and heartbeats of one node. Runs on the agent's threads: `register` and
    `probe_link` on its loop, `run` on its heartbeat thread."""

    def __init__(self, node: Agent) -> None:
        self.node = node
        self.interval_s = HEARTBEAT_S
        # (time.time() it was sent, "" or why it failed) of the last heartbeat, or None
        self.last_beat: tuple[float, str] | None = None
        # the runtime the marketplace was last told of (at registration, or by a heartbeat)
        self.sent_runtime: dict[str, Any] | None = None

    def register(self) -> bool:
        """Register once per server; waits (state ERROR) until the owner has logged in."""
        assert self.node.client is not None and self.node._hardware and self.node._bench
        s = self.node._settings
        while not self.node._stop.is_set():
            if self.node.client.node_key:
                self.node._set(registered=True, state=State.IDLE, reason="")
                return True
            provider = self.node.credentials.provider_key()
            if not provider:
                if self.node.status().state is not State.ERROR:
                    self.node._error("not logged in: run 'gpuflex-node login' or open Settings")
                self.node._set(state=State.ERROR, reason="not logged in: run 'gpuflex-node login'")
                self.node._wake.wait(1.0)
                self.node._wake.clear()
                continue
            name = s.node_name or self.node._hardware.cpu_name
            isolated = self.node._sandbox is not None and self.node._sandbox.isolated
            body = {
                "name": lane_name(name, self.node._lane.index) if self.node._lane else name,
                "kind": s.kind,
                "hardware": registration_hardware(self.node._hardware, s, isolated),
                "benchmark": self.node._bench.advertised(),
                "network": self.probe_rtt().to_dict(),
                "price_per_gpu_hour": s.price_per_gpu_hour,
                "availability": {
                    "idle_minutes": s.idle_minutes,
                    "schedule": [s.schedule_start, s.schedule_end],
                    "work_on_battery": s.work_on_battery,
                },
                "local_datasets": local_datasets.advertisement(s),  # never a row
            }
            if self.node.runtime is not None:  # desktop/runtime: what its tasks train with
                body["runtime"] = self.node.runtime.report()
            if s.kind == "platform":  # the operator's token; a volunteer sends none
                body["enrollment_token"] = s.enrollment_token
            if s.zone:
                body["zone"] = s.zone
            if s.zone and s.kind == "platform" and s.zone_listen:
                body["zone_url"] = s.zone_url or f"http://{s.zone_listen}"
            try:
                answer = self.node.client.register(provider, body)
            except Unavailable as exc:
                self.node._warn(f"cannot reach the marketplace to register: {exc.detail}")
                continue
            except ApiError as exc:
                self.node._error(f"registration refused: {exc}")
                self.node._set(state=State.ERROR, reason=f"registration refused ({exc.code})")
                if exc.status == 401:  # a wrong key: ask for it again rather than retry it
                    self.node.credentials.set_provider_key(None)
                else:  # the same body would be refused again: wait for new settings or a while
                    self.node._sleep(60.0)
                continue
            self.node.credentials.set_node_key(self.node._key_scope(), str(answer["node_key"]))
            self.node.credentials.set_node_id(self.node._key_scope(), str(answer["id"]))
            self.node.client.node_key = str(answer["node_key"])
            self.sent_runtime = body.get("runtime")
            self.node._set(node_id=str(answer["id"]))
            self.node._info(f"registered as node {answer['id']}")
        return False

    def probe_rtt(self, n: int = 3) -> NetworkFigures:
        """RTT before there is a node key: any answer (even 401) is one round trip."""
        assert self.node.client is not None
        for _ in range(n):
            t0 = time.monotonic()
            with contextlib.suppress(ApiError, Stopped):
                self.node.client._request("GET", "agent/me", attempts=1)
            self.node.netprobe.rtt(time.monotonic() - t0)
        return self.node.netprobe.figures()

    def probe_link(self) -> None:
        """Time the link both ways before the first heartbeat, so the marketplace plans this
        node's first round (its upload codec, its share of the round) on measured rates
        rather than a guess. Transfers made for tasks keep the figures current after."""
        assert self.node.client is not None
        try:
            t0 = time.monotonic()
            self.timed(self.node.client.probe_down(LINK_PROBE_BYTES), t0, upload=False)
            data = os.urandom(LINK_PROBE_BYTES)
            t0 = time.monotonic()
            self.node.client.probe_up(data)
            self.timed(data, t0, upload=True)
        except ApiError as exc:  # an older server, a throttle: plan on a guess
            self.node._info(f"link test skipped ({exc})")
            return
        figures = self.node.netprobe.figures()
        self.node._set(network=figures.to_dict())
        self.node._info(f"link: {figures.down_mbps} Mbit/s down, {figures.up_mbps} Mbit/s up, "
                   f"{figures.rtt_ms} ms")  # fmt: skip

    def timed(self, data: bytes, t0: float, upload: bool) -> None:
        """A transfer for the link's rate: the bytes that crossed the network, which for a
        gzip-encoded download are fewer than `data` holds."""
        wire = getattr(data, "wire_bytes", len(data))
        self.node.netprobe.transfer(wire, time.monotonic() - t0, upload=upload,
                               rtt_s=self.node.netprobe.latest_rtt_s())  # fmt: skip

    def run(self) -> None:
        beats = 0
        while not self.node._stop.is_set():
            self.beat(earnings=beats % 6 == 0)
            beats += 1
            self.node._write_status_file()
            self.node._stop.wait(self.interval_s)

    def beat(self, earnings: bool = False) -> None:
        if self.node.client is None or not self.node.client.node_key:
            return
        st = self.node.status()
        m = gpu_metrics(self.node._gpu_index, self.node._own_pids())
        metrics = {
            "gpu_util": m.utilization_pct,
            "gpu_temp_c": m.temperature_c,
            "gpu_mem_used_mb": m.memory_used_mb,
        }
        # unknown figures are left out, not sent as null (the server types them as numbers)
        body: dict[str, Any] = {
            "state": st.state.api,
            "metrics": {k: v for k, v in metrics.items() if v is not None},
            "network": {
                k: v for k, v in self.node.netprobe.figures().to_dict().items() if v is not None
            },
        }
        if st.state in (State.PAUSED, State.WAITING) and st.reason:
            body["reason"] = st.reason[:200]  # shown to buyers whose job waits on this node
        if st.task is not None:
            body["task_id"] = st.task.id
            body["progress"] = round(st.task.progress, 4)
        # every lease this node holds stays alive while it does: prefetched tasks and the one
        # whose update uploads too (the server takes at most HEARTBEAT_TASKS)
        held = [r.id for r in self.node.journal.open()]
        if held:
            body["task_ids"] = held[:HEARTBEAT_TASKS]
        runtime = self.node.runtime.report() if self.node.runtime is not None else None
        if runtime is not None and runtime != self.sent_runtime:  # changed since it said
            body["runtime"] = runtime
        try:
            t0 = time.monotonic()
            answer = self.node.client.heartbeat(body)
            if "runtime" in body:
                self.sent_runtime = body["runtime"]
            self.node.netprobe.rtt(time.monotonic() - t0)
            interval = answer.get("heartbeat_interval_s")
            if isinstance(interval, int | float) and interval > 0:
                self.interval_s = float(interval)
            if earnings:
                me = self.node.client.me()
                money = me.get("earnings", {})
                self.node._set(
                    earnings_today=str(money.get("today", "0.00")),
                    earnings_total=str(money.get("total", "0.00")),
                    earnings_held=str(money.get("held", "0.00")),
                )
            self.node._set(network=self.node.netprobe.figures().to_dict())
            self.last_beat = (time.time(), "")
        except (ApiError, Stopped) as exc:
            log.debug("heartbeat failed: %s", exc)
            self.last_beat = (time.time(), str(exc) or type(exc).__name__)
