"""The headless agent: the one public API that the `gpuflex-node` CLI and the tray app drive.

    agent = Agent(settings)          # or Agent() for the saved settings
    agent.start()                    # background thread: register, heartbeat, claim, train
    agent.pause(); agent.resume()
    agent.status()                   # an immutable snapshot, safe from any thread
    agent.subscribe(callback)        # log lines and state changes
    agent.stop()

Loop: register (once, with the provider key) → heartbeat (own thread) → claim (long poll) →
download → train in the sandbox → validate → upload, or report the failure with its reason.
Every step is journaled first (desktop.journal), so a crash anywhere resumes where it was.

Overlap (tasks marked `overlap`, docs/agent-api.md): once the update is written it uploads
in a background thread while the sandbox trains on from the local weights (a continuation,
see desktop.task_runner); the loop meanwhile claims and downloads the next task. Before that
task trains, the continuation is stopped gracefully and its progress (local now − local at
send) goes into the task's folder when the task is the same job's, at most one round on.
Progress is best effort and never journaled: whatever cannot be used is dropped.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from desktop import __version__, local_datasets
from desktop.agent_status import (  # re-exported: the CLI, the tray and tests import them here
    AgentStatus,
    Event,
    LaneStatus,
    LogEntry,
    State,
    TaskStatus,
)
from desktop.bench_result import BenchmarkResult
from desktop.client import (
    ApiError,
    Backoff,
    MarketplaceClient,
    SimulatedNetwork,
    Stopped,
    Unavailable,
    simulated_link,
)
from desktop.config import Credentials, Paths, Settings, load_settings, save_settings, sign_in
from desktop.hardware import GpuInfo, HardwareReport, gpu_metrics
from desktop.input_cache import InputCache
from desktop.journal import Journal, TaskRecord
from desktop.lanes import lane_env, lane_hardware, lane_paths, lane_scope, plan_lanes
from desktop.local_datasets import DatasetRefused, LocalDataset
from desktop.netprobe import NetProbe
from desktop.policy import Decision, Observations, WorkPolicy, decide, observe
from desktop.presence import Presence, registration_hardware
from desktop.probe import probe
from desktop.sandbox import Limits, Sandbox, SandboxResult, task_argv
from desktop.secagg_client import ProtocolError, SecAggDropped, SecAggSession, uses_secagg
from desktop.task_outputs import (
    UnsafeOutput,
    copy_output,
    is_regular,
    link_or_copy_output,
    numeric_metrics,
    opened_output,
    read_json_output,
    read_output,
)
from desktop.task_runner import (
    BYZANTINE_ENV,
    CONTINUE,
    CORRUPT_INPUT,
    DUTY_ENV,
    LOCAL,
    LOCAL_DATA,
    PAUSE,
    PROGRESS,
    STOP,
)
from desktop.warm_keeper import WarmKeeper

log = logging.getLogger("gpuflex.agent")

__all__ = ["Agent", "AgentStatus", "Event", "LaneStatus", "LogEntry", "State", "TaskStatus",
           "registration_hardware"]  # fmt: skip

TASK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # ids become folder names: no traversal
MAX_TRAIN_ATTEMPTS = 3  # a task that kills the sandbox this often is reported, not retried
FAIL_REASONS = {"oom", "timeout", "crashed", "sandbox", "cancelled"}
# how often a running task re-checks the work policy: a game that starts is noticed within
# this, and the task pauses within the sandbox's PAUSE_GRACE_S more (the owner's 2 s)
POLICY_CHECK_S = 0.5
CONTINUED = ".continue"  # a continuation's folder: the task's id and this (see Continuation)


@dataclass
class Continuation:
    """Training on from an overlap task's local weights while its update uploads."""

    rec: TaskRecord  # the task whose update was sent
    folder: Path  # its own folder: the task's is the upload's, and goes when that is done
    stop: threading.Event = field(default_factory=threading.Event)  # a graceful stop wanted
    thread: threading.Thread | None = None
    uploader: threading.Thread | None = None


class Agent:
    def __init__(
        self,
        settings: Settings | None = None,
        paths: Paths | None = None,
        *,
        credentials: Credentials | None = None,
        hardware: HardwareReport | None = None,
        bench: BenchmarkResult | None = None,
        transport: httpx.BaseTransport | None = None,
        observe_fn: Callable[[], Observations] | None = None,
        sandbox: Sandbox | None = None,
        backoff: Backoff | None = None,
        claim_wait_s: int = 20,
        idle_sleep_s: float = 1.0,
        policy_check_s: float = POLICY_CHECK_S,
        lane: GpuInfo | None = None,
        host: Agent | None = None,
    ) -> None:
        """`lane`, `host`: this agent drives one GPU of a multi-GPU host's agent (the host
        makes them, see _run_lanes); otherwise it is the machine's one agent."""
        self.paths = paths or Paths.default()
        self._settings = settings or load_settings(self.paths)
        self.credentials = credentials or Credentials(self.paths)
        self._hardware = hardware
        self._bench = bench
        self._bench_given = bench is not None
        self._lane = lane
        self._host = host
        self._gpu_index = lane.index if lane is not None else 0  # the GPU its policy watches
        self._lanes: list[Agent] = []  # a host's lanes, one per GPU (empty: works itself)
        self._transport = transport
        self._observe = observe_fn
        self._sandbox = sandbox
        self._backoff = backoff or Backoff()
        self.claim_wait_s = claim_wait_s
        self.idle_sleep_s = idle_sleep_s
        self.policy_check_s = policy_check_s  # how often a running task re-checks the policy
        # > 1 simulates a slower GPU (demos and tests on one machine): see _record_trained
        self.compute_scale = max(float(self._settings.extra.get("compute_scale", 1.0)), 1.0)
        # fault injection (desktop/fault_injection.py): "MODE:SCALE" for the task runner,
        # which corrupts every update this node sends; "" for an honest node
        self.byzantine = str(self._settings.extra.get("byzantine") or "")

        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._pause_reason = "paused by you"
        self._log_seq = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._hb_thread: threading.Thread | None = None
        self._subscribers: list[Callable[[Event], None]] = []
        self._log: deque[LogEntry] = deque(maxlen=500)
        self._status = AgentStatus(server=self._settings.server_url)
        self._policy_working = False
        self.journal = Journal(self.paths.journal)
        # per agent, beside its tasks: the byte counts the server keeps stay each node's own
        self.inputs = InputCache(self.paths.tasks.parent / "inputs")
        self.netprobe = NetProbe()
        self.presence = Presence(self)  # registration and heartbeats (desktop.presence)
        self.client: MarketplaceClient | None = None
        self.simnet: SimulatedNetwork | None = None
        self._continuation: Continuation | None = None
        self._uploading: set[str] = set()  # overlap tasks whose upload runs in the background
        self.zone: Any = None  # desktop.zone_server.ZoneService while this node aggregates
        self.warm: WarmKeeper | None = None  # starts and stops the sandbox's warm worker
        # the local datasets are to be advertised (at start, and after any change)
        self._datasets_due = threading.Event()
        self._datasets_due.set()

    # ----------------------------------------------------------------- public API

    def start(self) -> None:
        with self._lock:
            if self._thread and self._thread.is_alive():
                return
            self._stop.clear()
            self._set(state=State.STARTING, reason="")
            self._thread = threading.Thread(target=self._main, name="gpuflex-agent", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Graceful: the running task is stopped and kept in the journal for the next start."""
        self._stop.set()
        self._wake.set()
        if self.zone is not None:
            self.zone.stop()
            self.zone = None
        for t in (self._thread, self._hb_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout)
        self._set(state=State.STOPPED, reason="", task=None)
        self._write_status_file()

    def pause(self, reason: str = "") -> None:
        """`reason`: the owner's words ("gaming"), shown in the tray and sent to buyers."""
        reason = " ".join(reason.split())[:120]
        self._hold("paused by you" + (f": {reason}" if reason else ""))
        self._info(self._pause_reason.replace("paused by you", "paused", 1))

    def resume(self) -> None:
        self._release()
        self._info("resumed")

    def _hold(self, reason: str) -> None:
        """The owner's pause, for this agent and each of its lanes."""
        self._pause_reason = reason
        self._paused.set()
        self._wake.set()
        for lane in self._lanes:
            lane._hold(reason)
        self._set(state=State.PAUSED, reason=self._pause_reason)

    def _release(self) -> None:
        self._paused.clear()
        self._wake.set()
        for lane in self._lanes:
            lane._release()
        if self.status().state is State.PAUSED:
            self._set(state=State.IDLE, reason="")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def last_heartbeat(self) -> tuple[float, str] | None:
        """(time.time() it was sent, "" or why it failed) of the last heartbeat, or None."""
        return self.presence.last_beat

    @property
    def heartbeat_interval_s(self) -> float:
        return self.presence.interval_s

    def members(self) -> list[Agent]:
        """The agents that talk to the marketplace: a multi-GPU host's lanes, else itself."""
        return list(self._lanes) or [self]

    def warm_state(self) -> str:
        """The warm task worker's state (WarmKeeper.state: "idle" while no work wants it);
        "cold" before the sandbox."""
        if self.warm is not None:
            return self.warm.state()
        return self._sandbox.warm_state() if self._sandbox is not None else "cold"

    def status(self) -> AgentStatus:
        with self._lock:
            return self._status

    def logs(self, n: int = 100, after: int = 0) -> list[LogEntry]:
        """The last `n` lines, only those after sequence number `after`."""
        with self._lock:
            return [e for e in self._log if e.seq > after][-n:] if n > 0 else []

    @property
    def settings(self) -> Settings:
        return self._settings

    def update_settings(self, settings: Settings) -> None:
        """Saved at once; limits and policy apply from the next task, the server on restart."""
        with self._lock:
            if settings.excluded_gpus != self._settings.excluded_gpus:
                self._info("the GPUs to leave out apply when the agent starts again")
            self._settings = settings
            for lane in self._lanes:
                lane._settings = settings
                lane._wake.set()
        save_settings(settings, self.paths)
        self._wake.set()
        self._info("settings saved")

    def login(self, provider_key: str) -> None:
        """The provider key, through the one login (desktop.config.sign_in)."""
        with self._lock:
            sign_in(provider_key, self._settings, self.paths, self.credentials)
            for lane in self._lanes:  # each registers afresh with that account too
                self.credentials.set_node_key(lane._key_scope(), None)
                lane._wake.set()
        self._wake.set()

    # ---- local datasets (federated silos; desktop.local_datasets)

    def datasets(self) -> list[LocalDataset]:
        with self._lock:
            return local_datasets.declared(self._settings)

    def add_dataset(self, name: str, path: str, kind: str | None = None,
                    label_column: str = "label", image_size: int = 28) -> LocalDataset:  # fmt: skip
        """Read and declare a local dataset (DatasetRefused says why not); advertised next."""
        with self._lock:
            dataset = local_datasets.add(self._settings, name, path, kind, label_column,
                                         image_size)  # fmt: skip
            save_settings(self._settings, self.paths)
        self._datasets_changed(f"local dataset {name!r} declared: {dataset.rows} rows")
        return dataset

    def remove_dataset(self, name: str) -> None:
        with self._lock:
            local_datasets.remove(self._settings, name)
            save_settings(self._settings, self.paths)
        self._datasets_changed(f"local dataset {name!r} removed")

    def _datasets_changed(self, message: str) -> None:
        self._datasets_due.set()
        self._wake.set()
        for lane in self._lanes:  # they share this agent's settings: each node advertises them
            lane._datasets_changed("")
        if message:
            self._info(message)

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Called from the agent's threads; GUIs must hop to their own thread."""
        with self._lock:
            self._subscribers.append(callback)

    def run_forever(self) -> None:
        """For the CLI: start and block until stop() (or Ctrl-C)."""
        self.start()
        try:
            while self.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            self._info("stopping (Ctrl-C)")
        finally:
            self.stop()

    # ----------------------------------------------------------------- internals: events

    def _set(self, **changes: Any) -> None:
        # the loop may be between its pause check and an IDLE/WAITING update when the owner
        # pauses: a pause is never overwritten by those
        if self._paused.is_set() and changes.get("state") in (State.IDLE, State.WAITING):
            changes.update(state=State.PAUSED, reason=self._pause_reason)
        with self._lock:
            old = self._status
            self._status = replace(old, **changes)
            new = self._status
        if (old.state, old.reason, old.task, old.lanes) != (
            new.state,
            new.reason,
            new.task,
            new.lanes,
        ):
            self._emit(("state", new))

    def _emit(self, event: Event) -> None:
        for cb in list(self._subscribers):
            try:
                cb(event)
            except Exception:  # a broken listener must never stop the agent
                log.exception("event subscriber failed")

    def _add_log(self, level: str, message: str) -> None:
        if self._host is not None and self._lane is not None:  # one log, each line its GPU's
            self._host._add_log(level, f"GPU {self._lane.index}: {message}")
            return
        with self._lock:
            self._log_seq += 1
            entry = LogEntry(time.time(), level, message, self._log_seq)
            self._log.append(entry)
        getattr(log, level)(message)
        self._emit(("log", entry))

    def _info(self, message: str) -> None:
        self._add_log("info", message)

    def _trace(self, task_id: str, phase: str, t: float | None = None) -> None:
        """With GPUFLEX_TRACE=1, when each phase of a task ended, as JSON lines in the data
        folder's trace.jsonl: the round-phase bench (bench/rounds_bench.py) reads them."""
        if os.environ.get("GPUFLEX_TRACE") != "1":
            return
        line = json.dumps({"task": task_id, "phase": phase, "t": t or time.time()})
        with contextlib.suppress(OSError), (self.paths.data / "trace.jsonl").open("a") as f:
            f.write(line + "\n")

    def _warn(self, message: str) -> None:
        self._add_log("warning", message)

    def _error(self, message: str) -> None:
        self._add_log("error", message)
        self._set(last_error=message)

    def _write_status_file(self) -> None:
        if self._host is not None:
            return  # the host writes the machine's one status file, lanes included
        with contextlib.suppress(OSError):
            self.paths.data.mkdir(parents=True, exist_ok=True)
            tmp = self.paths.data / "status.tmp"
            tmp.write_text(json.dumps(self.status().to_dict()), encoding="utf-8")
            tmp.replace(self.paths.data / "status.json")

    # ----------------------------------------------------------------- internals: main loop

    def _main(self) -> None:
        try:
            self._probe_machine()
            assert self._hardware is not None
            gpus = None if self._lane else plan_lanes(self._hardware, self._settings.excluded_gpus)
            if gpus is not None:
                self._run_lanes(gpus)
                return
            self._setup()
            if not self.presence.register():
                return
            self._start_zone_service()
            self.presence.probe_link()
            self._hb_thread = threading.Thread(
                target=self.presence.run, name="gpuflex-heartbeat", daemon=True
            )
            self._hb_thread.start()
            self._loop()
        except Stopped:
            pass
        except Exception as exc:  # the last line of defence: say what happened, never vanish
            log.exception("agent crashed")
            self._error(f"agent stopped on an unexpected error: {type(exc).__name__}: {exc}")
            self._set(state=State.ERROR, reason=str(exc))
        finally:
            self._end_overlap()
            if self.client is not None:
                self.client.close()
            if self._sandbox is not None:
                self._sandbox.close()  # the warm task worker goes with the agent
            self._write_status_file()

    # ----------------------------------------------------------------- internals: lanes

    def _run_lanes(self, gpus: list[GpuInfo]) -> None:
        """A multi-GPU host: one lane per GPU (desktop.lanes), each a node of its own with its
        own claim loop, sandbox and work policy, run until the agent stops. This agent keeps
        the one local API, settings, login, log and status, which lists each lane."""
        assert self._hardware is not None
        if not gpus:
            why = "every GPU is left out (excluded_gpus in the settings)"
            self._warn(f"nothing to do: {why}")
            self._set(state=State.WAITING, reason=why)
            self._stop.wait()
            return
        self._info(f"{len(gpus)} GPUs, each its own node: " + ", ".join(
            f"GPU {g.index} ({g.name})" for g in gpus))  # fmt: skip
        for gpu in gpus:
            paths = lane_paths(self.paths, gpu.index)
            bench = self._bench if self._bench_given else None
            if bench is None:
                self._info(f"GPU {gpu.index}: benchmarking it (cached after the first run)…")
                bench = probe(paths.cache, quick=True, measure=True, gpu=gpu)[1]
            lane = Agent(
                self._settings, paths, credentials=self.credentials,
                hardware=lane_hardware(self._hardware, gpu.index), bench=bench,
                transport=self._transport, backoff=self._backoff, observe_fn=self._observe,
                claim_wait_s=self.claim_wait_s, idle_sleep_s=self.idle_sleep_s,
                policy_check_s=self.policy_check_s, lane=gpu, host=self,
            )  # fmt: skip
            lane.subscribe(self._lane_event)
            if self._paused.is_set():
                lane._hold(self._pause_reason)
            self._lanes.append(lane)
        self._set(hardware=self._hardware, benchmark=self._bench)
        try:
            for lane in self._lanes:
                lane.start()
            while not self._stop.wait(2.0):
                self._write_status_file()
        finally:
            for lane in self._lanes:  # all at once: each may wait for its task to stop
                lane._stop.set()
                lane._wake.set()
            for lane in self._lanes:
                lane.stop()
            self._lane_event(("state", None))

    def _as_lane(self, st: AgentStatus) -> LaneStatus:
        """This lane's line in its host's status."""
        return LaneStatus(gpu=self._gpu_index, gpu_name=self._lane.name if self._lane else "",
                          state=st.state, reason=st.reason, task=st.task, node_id=st.node_id,
                          completed=st.completed, failed=st.failed)  # fmt: skip

    def _lane_event(self, event: Event) -> None:
        kind = event[0]
        if kind == "state":
            self._set(**self._from_lanes())
        elif kind == "task_done":
            self._emit(event)

    def _from_lanes(self) -> dict[str, Any]:
        """The host's status from its lanes': working while any works, paused or waiting
        when all are; the reason names each GPU that is not working, and why."""
        sts = [lane.status() for lane in self._lanes]
        lanes = tuple(lane._as_lane(st) for lane, st in zip(self._lanes, sts, strict=True))
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

    def _probe_machine(self) -> None:
        """This machine's hardware and (unless given) benchmark, from a child process."""
        if self._lane is not None:
            return  # the host gave this lane its GPU's hardware and benchmark
        s = self._settings
        self._info(f"GPUFlex agent {__version__} starting; marketplace {s.server_url}")
        if self._hardware is None or self._bench is None:
            # in a child process: the agent itself never imports torch (see desktop.probe)
            measure = self._bench is None
            if measure:
                self._info("benchmarking this machine (cached after the first run)…")
            hw, bench, cached = probe(self.paths.cache, quick=True, measure=measure)
            self._hardware, self._bench = self._hardware or hw, self._bench or bench
            if measure:
                self._info("benchmark " + ("loaded from cache" if cached else "done"))
        for note in self._hardware.notes:
            self._info(note)

    def _setup(self) -> None:
        s = self._settings
        hw = self._hardware
        assert hw is not None and self._bench is not None
        if self.byzantine:
            self._warn(
                f"FAULT INJECTION: this node is Byzantine ({self.byzantine}): every update it "
                "sends is corrupted on purpose to attack the job; for robustness tests only"
            )
        if self.compute_scale != 1.0:
            # advertise what the simulated GPU would measure, so pay and sizing stay honest
            self._bench = self._bench.scaled(1.0 / self.compute_scale)
            self._info(f"simulating a GPU {self.compute_scale:g}x slower than this machine")
        if self._sandbox is None:
            self._sandbox = Sandbox(
                Limits(memory_mb=s.task_memory_mb, cpu_s=s.task_cpu_s, wall_s=s.task_wall_s),
                gpu=hw.accelerator != "cpu",
                warn=self._warn,
            )
        if self._lane is not None:  # its tasks see only this lane's GPU (desktop.lanes)
            self._sandbox.env.update(lane_env(self._lane))
        self.paths.tasks.mkdir(parents=True, exist_ok=True)
        # the warm worker starts when work is offered (desktop.warm_keeper), not now: a node
        # with no work holds only the agent. What a crash left in its folder comes back now
        self._sandbox.recover(self.paths.tasks)
        self.warm = WarmKeeper(self._sandbox, self.paths.tasks,
                               lambda: self._settings.warm_idle_s)  # fmt: skip
        for left in self.paths.tasks.glob(f"*{CONTINUED}"):  # a crash cut it short: dropped
            shutil.rmtree(left, ignore_errors=True)
        transport = self._transport
        if s.network_profile:
            node = simulated_link(s.node_name or "node")
            scale = float(s.extra.get("network_time_scale", 1.0))  # < 1 speeds up demos/tests
            self.simnet = SimulatedNetwork(
                s.network_profile, node=node, inner=transport, time_scale=scale
            )
            transport = self.simnet
            self._info(f"simulated network '{s.network_profile}': {self.simnet.node}")
        self.client = MarketplaceClient(
            s.server_url, self.credentials.node_key(self._key_scope()), transport=transport,
            backoff=self._backoff, stop=self._stop, on_retry=self._warn,
        )  # fmt: skip
        self._set(
            hardware=hw, benchmark=self._bench, isolated=self._sandbox.isolated,
            node_id=self.credentials.node_id(self._key_scope()) or "",
        )  # fmt: skip

    def _start_zone_service(self) -> None:
        """A platform node with `zone_listen` serves as its zone's aggregator
        (desktop/zone_server.py) for as long as the agent runs."""
        s = self._settings
        if s.kind != "platform" or not s.zone or not s.zone_listen or self.zone is not None:
            return
        from desktop.zone_server import ZoneAggregator, ZoneService

        assert self.client is not None
        hold = float(s.extra.get("zone_max_hold_s", 30.0))
        spool = self.paths.cache / "zone-uploads"  # members' bodies on disk (/tmp may be RAM)
        spool.mkdir(parents=True, exist_ok=True)
        aggregator = ZoneAggregator(self.client, s.zone, max_hold_s=hold, spool_dir=spool)
        self.zone = ZoneService(aggregator, s.zone_listen)
        self.zone.start()
        self._info(f"zone {s.zone}: aggregating on {s.zone_listen}")

    def _deliver(self, rec: TaskRecord, data: bytes) -> int:
        """The update to the coordinator, or, for a task routed through its zone (`zone`),
        to the zone's aggregator after telling the coordinator its hash. Anything wrong on
        the zone's path (the aggregator gone, a refusal) falls back to the coordinator."""
        assert self.client is not None
        zone = rec.task.get("zone")
        node_id = self.status().node_id
        if zone and node_id:
            try:
                self.client.hand_off(rec.id, int(zone["aggregator"]), rec.update_sha256)
                return self.client.zone_upload(zone, rec.id, node_id, data, rec.metrics)
            except (ApiError, KeyError, ValueError, TypeError) as exc:
                if isinstance(exc, ApiError) and exc.status == 404:
                    raise  # the task is not ours any more: the flat upload would say the same
                self._warn(f"task {rec.id}: zone aggregator unusable ({exc}); uploading here")
        return self.client.put_update(rec.id, data, rec.metrics)

    def _key_scope(self) -> str:
        """What this node's key and id are kept under: the server's, or a lane's own."""
        url = self._settings.server_url
        return url if self._lane is None else lane_scope(url, self._lane.index)

    def _own_pids(self) -> set[int]:
        return self._sandbox.current_pids() if self._sandbox is not None else set()

    def _policy(self) -> Decision:
        obs = self._observe() if self._observe else observe(self._own_pids(), self._gpu_index)
        return decide(WorkPolicy.from_settings(self._settings), obs, self._policy_working)

    def _loop(self) -> None:
        assert self.client is not None
        outage = 0
        while not self._stop.is_set():
            self._cool_warm()
            if self._datasets_due.is_set():
                self._advertise_datasets()
            if self._paused.is_set():
                self._set(state=State.PAUSED, reason=self._pause_reason, task=None)
                self._release_overdue(self._pause_reason)
                self._sleep(self.idle_sleep_s)
                continue
            decision = self._policy()
            if not decision.allowed:
                if self.status().state is not State.WAITING:
                    self._info(f"waiting: {decision}")
                self._set(state=State.WAITING, reason=str(decision), task=None)
                self._release_overdue(str(decision))
                self._sleep(self.idle_sleep_s * 5)
                continue
            try:
                pending = [r for r in self.journal.open() if r.id not in self._uploading]
                if pending:
                    self._process(pending[0])
                else:
                    if not self._overlap_shown():  # else the status shows the continuation
                        self._set(state=State.IDLE, reason="", task=None)
                    task = self.client.claim(self.claim_wait_s)
                    if task is not None:
                        self._trace(str(task.get("id", "")), "claimed")
                        if not self._hand_back_if_too_big(task):
                            self._accept(task)
                outage = 0
            except Unavailable as exc:
                outage += 1
                delay = self._backoff.delay(min(outage, 10), self.client._rng)
                self._warn(f"marketplace unreachable ({exc.detail}); trying again in {delay:.0f} s")
                self._set(reason="marketplace unreachable")
                self._sleep(delay)
            except ApiError as exc:
                if exc.status == 401:
                    self._error("the marketplace rejected this node's key (revoked?)")
                    self._set(state=State.ERROR, reason="node key rejected: log in again")
                    self.credentials.set_node_key(self._key_scope(), None)
                    self.client.node_key = None
                    if not self.presence.register():
                        return
                else:
                    self._error(f"marketplace error: {exc}")
                    self._sleep(self.idle_sleep_s * 5)

    def _cool_warm(self) -> None:
        """Stop the warm task worker once no work has used it for `warm_idle_s`."""
        cont = self._continuation
        busy = cont is not None and cont.thread is not None and cont.thread.is_alive()
        if self.warm is not None and self.warm.cool(busy):
            self._info(f"warm task worker stopped: no work for {self._settings.warm_idle_s:g} s"
                       " (the next task starts it again)")  # fmt: skip

    def _advertise_datasets(self) -> None:
        """Tell the marketplace which local datasets this node holds (never their rows)."""
        assert self.client is not None
        self._datasets_due.clear()
        try:
            self.client.put_datasets(local_datasets.advertisement(self._settings))
        except ApiError as exc:
            if exc.status == 404:  # a marketplace without federated silos: asking again won't help
                if local_datasets.advertisement(self._settings):
                    self._warn(f"this marketplace does not take local datasets ({exc})")
                return
            self._datasets_due.set()  # the next pass tries again
            self._warn(f"could not advertise the local datasets ({exc})")
        except Stopped:
            self._datasets_due.set()

    def _sleep(self, seconds: float) -> None:
        if self._wake.wait(seconds):
            self._wake.clear()

    # ----------------------------------------------------------------- internals: tasks

    def _accept(self, task: dict[str, Any]) -> None:
        tid = str(task.get("id", ""))
        if not TASK_ID.match(tid):
            self._error(f"the marketplace sent a task with an unusable id {tid[:40]!r}")
            return
        known = self.journal.get(tid)
        if known is None or known.state == "done":  # done before: the server leased it anew
            self.journal.record(tid, "claimed", task=task, attempts=0, outcome="")
            self._info(f"claimed task {tid} (job {task.get('job_id')}, round {task.get('round')})")
        rec = self.journal.get(tid)
        assert rec is not None
        self._process(rec)

    def _free_memory_bytes(self) -> tuple[int, bool]:
        """(bytes a task may use now, whether on a GPU): the GPU's free memory, or on a CPU
        node the available RAM within the sandbox's limit."""
        hw = self._hardware
        gpu = hw.primary_gpu if hw is not None and hw.accelerator != "cpu" else None
        if gpu is not None:
            used = gpu_metrics(self._gpu_index, self._own_pids()).memory_used_mb or 0
            return max(gpu.memory_total_mb - used, 0) * 2**20, True
        import psutil

        limit = self._settings.task_memory_mb * 2**20
        return min(int(psutil.virtual_memory().available), limit), False

    def _hand_back_if_too_big(self, task: dict[str, Any]) -> bool:
        """Check a claimed task's memory estimate (trainer.fit) against the free memory before
        taking it on; one that does not fit goes straight back, nothing downloaded."""
        from trainer.fit import check_task

        assert self.client is not None
        free, on_gpu = self._free_memory_bytes()
        reason = check_task(task, free, on_gpu)
        if reason is None:
            return False
        tid = str(task.get("id", ""))
        self._warn(f"task {tid} does not fit this machine ({reason}); handing it back")
        self.client.fail(tid, "oom", f"does not fit: {reason}"[:300])
        self._sleep(self.idle_sleep_s * 5)  # memory may free up; others may take it meanwhile
        return True

    def _folder(self, tid: str) -> Path:
        return self.paths.tasks / tid

    def _task_status(self, rec: TaskRecord, phase: str, progress: float = 0.0) -> TaskStatus:
        cur = self.status().task
        started = cur.started if cur is not None and cur.id == rec.id else time.time()
        return TaskStatus(
            rec.id, str(rec.task.get("job_id", "")), int(rec.task.get("round", 0) or 0),
            phase, progress, started,
        )  # fmt: skip

    def _process(self, rec: TaskRecord) -> None:
        if self.warm is not None:
            self.warm.offered()  # torch imports in the worker while the inputs download
        try:
            self._process_task(rec)
        finally:
            if self.warm is not None:
                self.warm.used()

    def _process_task(self, rec: TaskRecord) -> None:
        assert self.client is not None
        if rec.state in ("claimed", "ready") and self._deadline_passed(rec.task):
            self._finish_failed(rec, "cancelled", "the task's deadline passed before it ran")
            return
        inputs = LOCAL_DATA if rec.task.get("local_dataset") else "shard.safetensors"
        if rec.state == "ready" and not (self._folder(rec.id) / inputs).exists():
            rec = self.journal.record(rec.id, "claimed")  # inputs lost (data folder wiped)
        if rec.state == "claimed":
            self._set(state=State.WORKING, task=self._task_status(rec, "downloading"))
            try:
                self._download(rec)
                self._trace(rec.id, "downloaded")
            except DatasetRefused as exc:  # a federated task's local dataset is gone or broken
                self._datasets_due.set()
                self._finish_failed(rec, "crashed", str(exc))
                return
            except ApiError as exc:
                if exc.status not in (403, 404, 410):
                    raise
                # the lease is gone (expired while we were down, or reassigned): drop it
                self._warn(f"task {rec.id} is no longer ours ({exc.code}); dropping it")
                self._done(rec, "lost", ok=False)
                return
            self._hand_progress(rec)
            rec = self.journal.record(rec.id, "ready", downloads=rec.downloads + 1)
        if rec.state == "ready":
            self._halt_continuation()  # the sandbox trains one thing at a time
            if rec.attempts >= MAX_TRAIN_ATTEMPTS:
                self._finish_failed(rec, "crashed", f"gave up after {rec.attempts} attempts")
                return
            self._train(rec)
            rec = self.journal.get(rec.id) or rec
            if rec.state == "claimed":  # the inputs came corrupt: fetch and train once more
                self._process(rec)
                return
        if rec.state == "trained":
            if self._may_overlap(rec):
                self._upload_and_continue(rec)
            else:
                self._upload(rec)

    def _release_overdue(self, why: str) -> None:
        """While this node may not work, a task it holds past its deadline goes back to the
        marketplace at once, for another node to take: heartbeats would otherwise keep its
        lease alive for as long as the game goes on, and hold its round up."""
        st = self.status()
        for rec in self.journal.open():
            if (
                rec.state in ("claimed", "ready")
                and rec.id not in self._uploading
                and self._deadline_passed(rec.task)
            ):
                with contextlib.suppress(Unavailable):  # reported on a later pass
                    self._finish_failed(rec, "cancelled", f"not run by its deadline: {why}")
                self._set(state=st.state, reason=st.reason)  # still waiting, for the same reason

    def _deadline_passed(self, task: dict[str, Any]) -> bool:
        raw = task.get("deadline")
        if not raw:
            return False
        try:
            deadline = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            return False
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=dt.UTC)
        return dt.datetime.now(dt.UTC) > deadline

    def _download(self, rec: TaskRecord) -> None:
        """Fetch the task's inputs; the sandboxed runner checks them against the task's hashes
        (a mismatch comes back as `corrupt_input`, and `_train` fetches them once more)."""
        assert self.client is not None
        folder = self._folder(rec.id)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("model*.safetensors"):
            stale.unlink()
        self._fetch_model(rec, folder)
        if rec.task.get("local_dataset"):  # federated: the node's own data, never downloaded
            self._local_input(rec, folder)
        elif self.inputs.copy_to(rec.task.get("shard_hash"), folder / "shard.safetensors"):
            # this node holds a shard with the task's content hash (any job's, any round's)
            self._trace(rec.id, "shard_cached")
        else:
            shard = self._timed_get(self.client.get_shard, rec.id)
            (folder / "shard.safetensors").write_bytes(shard)
        (folder / "task.json").write_text(json.dumps(rec.task), encoding="utf-8")
        residual = self._residual_file(rec)
        if rec.task.get("codec") == "topk" and os.path.lexists(residual):
            try:  # a task wrote it once: copied as a regular file only (desktop.task_outputs)
                copy_output(residual.parent, residual.name, folder / "residual.safetensors")
            except UnsafeOutput as exc:
                self._warn(f"task {rec.id}: the kept residual is dropped ({exc})")
                residual.unlink(missing_ok=True)

    def _local_dataset(self, rec: TaskRecord) -> LocalDataset:
        """A federated task's local dataset, re-read first when its file changed since it
        was declared (its rows, schema and hash are then advertised anew)."""
        name = str(rec.task.get("local_dataset"))
        with self._lock:
            dataset = local_datasets.find(self._settings, name)
        if dataset is None:
            raise DatasetRefused(f"this node no longer holds a local dataset named {name!r}")
        if dataset.changed():
            self._info(f"local dataset {name!r} changed on disk; reading it again")
            dataset = local_datasets.inspect(name, dataset.path, dataset.kind,
                                             dataset.label_column, dataset.image_size)  # fmt: skip
            with self._lock:
                local_datasets.replace_entry(self._settings, dataset)
                save_settings(self._settings, self.paths)
            self._datasets_due.set()
        return dataset

    def _local_input(self, rec: TaskRecord, folder: Path) -> None:
        """Where the sandboxed runner reads the task's local dataset (desktop.task_runner)."""
        assert self._sandbox is not None
        d = self._local_dataset(rec)
        where = {
            "name": d.name,
            "kind": d.kind,
            "label_column": d.label_column,
            "image_size": d.image_size,
            "path": self._sandbox.data_path(d.name, Path(d.path)),
        }
        (folder / LOCAL_DATA).write_text(json.dumps(where), encoding="utf-8")
        self._info(f"task {rec.id} trains on local dataset {d.name!r} ({d.rows} rows)")

    def _fetch_model(self, rec: TaskRecord, folder: Path) -> None:
        """The round's model the way the task's `model_source` says: from the cache, built
        from the seed by the runner (nothing to fetch), as deltas against a model this node
        holds, or whole. A second download (the first came corrupt) is always whole."""
        assert self.client is not None
        cached = self.inputs.get(rec.task.get("model_hash"))
        if cached is not None:
            self._trace(rec.id, "model_cached")
            (folder / "model.safetensors").write_bytes(cached)
            return
        source = rec.task.get("model_source") or {}
        kind = source.get("kind") if rec.downloads == 0 else "full"
        if kind == "seed":
            self._info(f"task {rec.id}: the model is built here from the job's seed")
            return  # desktop.task_runner builds it and checks it against model_hash
        base = self.inputs.get(source.get("base")) if kind == "delta" else None
        chain = source.get("chain")
        if base is not None and isinstance(chain, list) and chain:
            (folder / "model.base.safetensors").write_bytes(base)
            held, size = str(source["base"]), 0
            for i, step in enumerate(chain):
                data = self._timed_get(lambda tid, b=held: self.client.get_model(tid, b), rec.id)
                (folder / f"model.delta.{i}.safetensors").write_bytes(data)
                held, size = str(step), size + len(data)
            self._info(f"task {rec.id}: the model came as {len(chain)} delta(s), {size} bytes")
            self._trace(rec.id, "model_delta")
            return
        (folder / "model.safetensors").write_bytes(self._timed_get(self.client.get_model, rec.id))

    def _job_file(self, kind: str, job_id: object) -> Path:
        """A file kept per job between its tasks, under data/`kind` (the id made a safe name)."""
        job = re.sub(r"[^A-Za-z0-9_.-]", "_", str(job_id or "job"))[:128]
        return self.paths.tasks.parent / kind / f"{job}.safetensors"

    def _residual_file(self, rec: TaskRecord) -> Path:
        """Top-k's error-feedback residual for the task's job, kept between its tasks."""
        return self._job_file("feedback", rec.task.get("job_id", "job"))

    def _timed_get(self, get: Callable[[str], bytes], tid: str) -> bytes:
        t0 = time.monotonic()
        data = get(tid)
        self.presence.timed(data, t0, upload=False)
        return data

    def _train(self, rec: TaskRecord) -> None:
        assert self._sandbox is not None
        folder = self._folder(rec.id)
        # an earlier attempt's outputs and pause request; its paused state stays, to resume
        for stale in ("update.safetensors", "result.json", PAUSE):
            (folder / stale).unlink(missing_ok=True)
        rec = self.journal.record(rec.id, "ready", attempts=rec.attempts + 1)
        # working again: whatever held it back (a game, the heat) is no longer the reason
        self._set(state=State.WORKING, reason="", task=self._task_status(rec, "training"))
        self._info(f"training task {rec.id} (attempt {rec.attempts})")
        drop_at = None
        if self.simnet is not None:
            drop_at = self.simnet.begin_round(int(rec.task.get("round", 0) or 0))
        self._policy_working = True
        policy_stop: list[str] = []

        def should_stop() -> str | None:
            if self._stop.is_set():
                return "the agent is stopping"
            if self._paused.is_set():
                return self._pause_reason
            return None

        def on_event(event: dict[str, Any]) -> None:
            nonlocal drop_at
            if isinstance(event.get("phase"), str) and isinstance(event.get("t"), float):
                self._trace(rec.id, f"runner_{event['phase']}", event["t"])
            if isinstance(note := event.get("note"), str):  # e.g. resuming from a pause
                self._info(f"task {rec.id}: {note[:200]}")
            progress = event.get("progress")
            if isinstance(progress, int | float):
                self._set(task=self._task_status(rec, "training", float(progress)))
                if drop_at is not None and progress >= drop_at and self.simnet is not None:
                    self._warn("simulated network: this node drops out of the round now")
                    self.simnet.go_dark()
                    drop_at = None

        s = self._settings
        self._sandbox.limits = Limits(
            memory_mb=s.task_memory_mb, cpu_s=s.task_cpu_s, wall_s=s.task_wall_s
        )
        self._sandbox.env["GPUFLEX_GPU_MEMORY_FRACTION"] = str(s.gpu_memory_fraction)
        self._sandbox.env[DUTY_ENV] = str(s.max_gpu_busy_pct / 100)
        if self.byzantine:
            self._sandbox.env[BYZANTINE_ENV] = self.byzantine
        self._trace(rec.id, "sandbox_called")
        read_only = None
        if rec.task.get("local_dataset"):  # the local dataset, bound read-only (never copied)
            try:
                d = self._local_dataset(rec)
            except DatasetRefused as exc:
                self._policy_working = False
                self._datasets_due.set()
                self._finish_failed(rec, "crashed", str(exc))
                return
            read_only = {d.path: self._sandbox.data_path(d.name, Path(d.path))}
        try:
            result = self._sandbox.run_task(folder, self._should_stop(should_stop, policy_stop),
                                            on_event, read_only)  # fmt: skip
        finally:
            self._policy_working = False
        self._trace(rec.id, "sandbox_returned")
        if result.status == "cancelled":
            # kept as "ready": trained again later, from where it paused when it could save
            # its state, else from its start (training is deterministic either way)
            self.journal.record(rec.id, "ready", attempts=rec.attempts - 1)
            self._info(f"task {rec.id} interrupted: {result.detail}")
            return
        if result.status == CORRUPT_INPUT:
            source = rec.task.get("model_source") or {}
            self.inputs.drop(rec.task.get("model_hash"), rec.task.get("shard_hash"),
                             source.get("base"))  # fmt: skip
            if rec.downloads >= 2:
                self._finish_failed(rec, "crashed", f"inputs corrupt after two downloads: "
                                    f"{result.detail}")  # fmt: skip
            else:
                self._warn(f"task {rec.id}: download {rec.downloads} is corrupt ({result.detail})")
                self.journal.record(rec.id, "claimed", attempts=rec.attempts - 1)
            return
        if not result.ok:
            self._finish_failed(rec, result.status if result.status in FAIL_REASONS else "crashed",
                                result.detail or "the task failed")  # fmt: skip
            return
        self._record_trained(rec, result)

    def _should_stop(
        self, base: Callable[[], str | None], policy_stop: list[str]
    ) -> Callable[[], str | None]:
        """The owner's pause and quit at once; the work policy at most every few seconds."""
        last = [time.monotonic()]

        def check() -> str | None:
            why = base()
            if why:
                return why
            if time.monotonic() - last[0] >= self.policy_check_s:
                last[0] = time.monotonic()
                decision = self._policy()
                if not decision.allowed:
                    policy_stop.append(str(decision))
                    return f"work policy: {decision}"
            return None

        return check

    def _record_trained(self, rec: TaskRecord, result: SandboxResult) -> None:
        folder = self._folder(rec.id)
        for name, key in (("model", "model_hash"), ("shard", "shard_hash")):
            # the runner checked both against the task's hashes before it trained; the task
            # could have put a symlink in their place since: cached only as regular files
            with (
                contextlib.suppress(UnsafeOutput),
                opened_output(folder, f"{name}.safetensors") as source,
            ):
                self.inputs.put(rec.task.get(key), source)
        try:  # the runner has checked the update against the model (desktop.task_runner)
            data = read_output(folder, "update.safetensors")
            metrics = numeric_metrics(read_json_output(folder, "result.json"))
        except UnsafeOutput as exc:  # its message names the file, never quotes its bytes
            self._finish_failed(rec, "crashed", f"the task produced an unusable update: {exc}")
            return
        if self.compute_scale > 1.0:
            # a simulated slower GPU takes longer for the same (bit-identical) result
            extra = (self.compute_scale - 1.0) * metrics.get("compute_s", 0.0)
            self._stop.wait(extra)
            metrics["compute_s"] = metrics.get("compute_s", 0.0) * self.compute_scale
        self.journal.record(
            rec.id, "trained", update_sha256=hashlib.sha256(data).hexdigest(), metrics=metrics
        )
        self._info(
            f"task {rec.id} trained: loss {metrics.get('loss', float('nan')):.4f}, "
            f"{metrics.get('compute_s', 0):.1f} s"
        )

    def _upload(self, rec: TaskRecord, background: bool = False) -> None:
        """`background`: beside the loop, for an overlap task (see _upload_and_continue)."""
        assert self.client is not None
        if not background:
            self._set(state=State.WORKING, task=self._task_status(rec, "uploading", 1.0))
        try:
            data = read_output(self._folder(rec.id), "update.safetensors")
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() != rec.update_sha256:
            # the file changed since it was journaled: never send other bytes than recorded
            self.journal.record(rec.id, "claimed")
            self._warn(f"task {rec.id}: update file lost or changed on disk; running it again")
            return
        session = None
        if uses_secagg(rec.task):  # the update leaves this node masked, or not at all
            session = SecAggSession(self.client, rec.task, stop=self._stop, log=self._info)
            try:
                data = session.masked_update(data)
            except Unavailable:
                raise  # the server is away: the task waits, as for any other request
            except (SecAggDropped, ProtocolError, ApiError) as exc:
                self._finish_failed(rec, "cancelled", f"secure aggregation: {exc}")
                return
        t0 = time.monotonic()
        try:
            self._trace(rec.id, "upload_started")
            code = self._deliver(rec, data)
            self._trace(rec.id, "uploaded")
        except ApiError as exc:
            if isinstance(exc, Unavailable):
                raise
            if exc.status in (409, 422):  # refused once the body was in: it timed the link
                self.presence.timed(data, t0, upload=True)
            outcome = {404: "lost", 409: "conflict", 422: "rejected"}.get(exc.status or 0, "error")
            self._error(f"task {rec.id}: upload refused ({exc})")
            self._done(rec, outcome, ok=False, background=background)
            return
        self.presence.timed(data, t0, upload=True)
        self._info(f"task {rec.id} uploaded" + (" (already accepted)" if code == 200 else ""))
        if session is not None:
            try:
                session.unmask()
            except Unavailable:
                raise
            except (SecAggDropped, ProtocolError, ApiError) as exc:
                self._warn(f"task {rec.id}: secure aggregation's unmasking failed ({exc})")
        residual = self._folder(rec.id) / "residual.next.safetensors"
        if os.path.lexists(residual):  # only once the server has the update it complements
            try:  # copied from the opened file: a task's symlink is never carried onward
                copy_output(residual.parent, residual.name, self._residual_file(rec))
            except UnsafeOutput as exc:
                self._warn(f"task {rec.id}: its residual is dropped ({exc})")
        self._done(rec, "uploaded", ok=True, background=background)

    def _finish_failed(self, rec: TaskRecord, reason: str, detail: str) -> None:
        assert self.client is not None
        self._error(f"task {rec.id} failed ({reason}): {detail}")
        try:
            self.client.fail(rec.id, reason, detail[:1000])
        except Unavailable:
            raise  # the journal still says not done: reported on the next pass
        except ApiError as exc:
            self._warn(f"task {rec.id}: failure report refused ({exc})")
        self._done(rec, f"failed:{reason}", ok=False)

    def _done(self, rec: TaskRecord, outcome: str, ok: bool, background: bool = False) -> None:
        self.journal.record(rec.id, "done", outcome=outcome)
        shutil.rmtree(self._folder(rec.id), ignore_errors=True)
        st = self.status()
        counts = {"completed": st.completed + (1 if ok else 0),
                  "failed": st.failed + (0 if ok else 1)}  # fmt: skip
        if not background:
            self._set(task=None, state=State.IDLE, **counts)
        elif st.task is not None and st.task.id == rec.id:  # the loop's own task is its own
            self._set(task=replace(st.task, phase="training on"), **counts)
        else:
            self._set(**counts)
        self._emit(("task_done", {"id": rec.id, "outcome": outcome, "ok": ok}))

    # ----------------------------------------------------------------- internals: overlap

    def _may_overlap(self, rec: TaskRecord) -> bool:
        """An overlap task whose runner left its local weights, with the agent free to go on."""
        return (
            rec.task.get("overlap") is True
            and is_regular(self._folder(rec.id), LOCAL)
            and not (self._stop.is_set() or self._paused.is_set())
        )

    def _upload_and_continue(self, rec: TaskRecord) -> None:
        """Upload in the background while a continuation trains on; the loop goes on to claim
        and download the next task. The journal still says `trained` until the upload is in,
        so a crash sends the very same bytes again; the continuation is never journaled."""
        self._halt_continuation()
        src = self._folder(rec.id)
        folder = self.paths.tasks / f"{rec.id}{CONTINUED}"
        try:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for name in ("task.json", "shard.safetensors", LOCAL):
                link_or_copy_output(src, name, folder / name)  # a symlink is refused
            marker = {"task": rec.id, "pace": self.compute_scale}  # see task_runner._pace
            (folder / CONTINUE).write_text(json.dumps(marker), encoding="utf-8")
        except OSError as exc:  # best effort: the upload is what counts
            self._warn(f"task {rec.id}: cannot train on while uploading ({exc})")
            shutil.rmtree(folder, ignore_errors=True)
            self._upload(rec)
            return
        cont = Continuation(rec, folder)
        cont.thread = threading.Thread(target=self._continue, args=(cont,), daemon=True,
                                       name="gpuflex-continuation")  # fmt: skip
        cont.uploader = threading.Thread(target=self._background_upload, args=(rec,),
                                         daemon=True, name="gpuflex-upload")  # fmt: skip
        self._uploading.add(rec.id)
        self._continuation = cont
        self._set(state=State.WORKING, task=self._task_status(rec, "uploading, training on", 0.0))
        self._info(f"task {rec.id}: uploading, training on meanwhile")
        cont.thread.start()
        cont.uploader.start()

    def _background_upload(self, rec: TaskRecord) -> None:
        try:
            self._upload(rec, background=True)
        except (ApiError, Stopped) as exc:  # still `trained`: the loop sends it again
            self._warn(f"task {rec.id}: upload interrupted ({exc}); it will be sent again")
        finally:
            self._uploading.discard(rec.id)
            self._wake.set()

    def _continue(self, cont: Continuation) -> None:
        """Run the continuation; keep its progress for the job's next task (_hand_progress)."""
        assert self._sandbox is not None
        rec = cont.rec
        graceful = self._should_stop(
            lambda: "stop" if cont.stop.is_set() or self._paused.is_set() else None, []
        )

        def should_stop() -> str | None:
            if self._stop.is_set():
                return "the agent is stopping"  # no time to be graceful: its progress goes
            if graceful():
                cont.stop.set()
                self._sandbox.signal(cont.folder, STOP)  # again until seen: it may be moving
            return None

        def on_event(event: dict[str, Any]) -> None:
            progress = event.get("progress")
            st = self.status().task
            if isinstance(progress, int | float) and st is not None and st.id == rec.id:
                self._set(task=replace(st, progress=float(progress)))

        try:
            result = self._sandbox.run(cont.folder, task_argv(cont.folder.resolve()),
                                       should_stop, on_event)  # fmt: skip
            self._keep_progress(cont, result)
        except Exception as exc:  # best effort: a continuation never stops the agent
            log.exception("continuation failed")
            self._warn(f"task {rec.id}: training on failed ({exc}); its progress is dropped")
        finally:
            shutil.rmtree(cont.folder, ignore_errors=True)
            self._wake.set()

    def _keep_progress(self, cont: Continuation, result: SandboxResult) -> None:
        try:
            outcome = read_json_output(cont.folder, "result.json")
            steps = int(numeric_metrics(outcome)["steps"])
        except (OSError, ValueError, KeyError):
            outcome, steps = {}, 0
        rec = cont.rec
        if not result.ok or outcome.get("status") != "ok" or steps < 1 or self._stop.is_set():
            why = result.detail or "no steps done"
            self._info(f"task {rec.id}: trained on without usable progress ({why})")
            return
        target = self._progress_file(str(rec.task.get("job_id", "")))
        target.parent.mkdir(parents=True, exist_ok=True)
        meta = {"job_id": rec.task.get("job_id"), "round": rec.task.get("round"), "task": rec.id}
        try:  # copied from the opened file: a task's symlink is never carried onward
            copy_output(cont.folder, PROGRESS, target)
        except UnsafeOutput as exc:
            self._info(f"task {rec.id}: its progress is dropped ({exc})")
            return
        target.with_suffix(".json").write_text(json.dumps(meta), encoding="utf-8")
        self._info(f"task {rec.id}: trained on {steps} step(s) while uploading")

    def _progress_file(self, job_id: str) -> Path:
        """A continuation's progress for the job's next task, kept beside top-k's residuals."""
        return self._job_file("progress", job_id)

    def _hand_progress(self, rec: TaskRecord) -> None:
        """Before `rec` trains: stop the continuation and give `rec` its progress when `rec`
        is an overlap task of the same job at most one round on; any other progress is stale
        (the job changed, or rounds passed) and dropped."""
        self._halt_continuation()
        store = self._progress_file("").parent
        if not store.is_dir():
            return
        job, rnd = str(rec.task.get("job_id", "")), int(rec.task.get("round", 0) or 0)
        for meta_file in store.glob("*.json"):
            data = meta_file.with_suffix(".safetensors")
            try:
                meta = json.loads(meta_file.read_text(encoding="utf-8"))
                fresh = (rec.task.get("overlap") is True and str(meta["job_id"]) == job
                         and 0 <= rnd - int(meta["round"]) <= 1)  # fmt: skip
            except (OSError, ValueError, TypeError, KeyError):
                fresh = False
            if fresh and is_regular(store, data.name):
                copy_output(store, data.name, self._folder(rec.id) / PROGRESS)
                self._info(f"task {rec.id}: starts from the model plus the progress made "
                           f"since task {meta['task']} was sent")  # fmt: skip
            data.unlink(missing_ok=True)
            meta_file.unlink(missing_ok=True)

    def _halt_continuation(self) -> None:
        """Stop a running continuation gracefully (the runner stops before its next step and
        keeps the steps done) and wait for it; its upload goes on."""
        cont = self._continuation
        if cont is None or cont.thread is None:
            return
        if cont.thread.is_alive():
            cont.stop.set()
            assert self._sandbox is not None
            self._sandbox.signal(cont.folder, STOP)
            cont.thread.join()
        self._continuation = None

    def _overlap_shown(self) -> bool:
        """While nothing else runs, the status shows the continuation, if one trains or its
        task uploads."""
        cont = self._continuation
        if cont is None:
            return False
        training = cont.thread is not None and cont.thread.is_alive()
        uploading = cont.rec.id in self._uploading
        if not (training or uploading):
            return False
        phase = "uploading, training on" if uploading and training else (
            "uploading" if uploading else "training on")  # fmt: skip
        st = self.status().task
        progress = st.progress if st is not None and st.id == cont.rec.id else 0.0
        self._set(state=State.WORKING, reason="",
                  task=self._task_status(cont.rec, phase, progress))  # fmt: skip
        return True

    def _end_overlap(self) -> None:
        """On the way out: the continuation (killed, as the agent stops) and the upload."""
        cont = self._continuation
        if cont is None:
            return
        for t in (cont.thread, cont.uploader):
            if t is not None and t is not threading.current_thread():
                t.join(30.0)
        self._continuation = None
