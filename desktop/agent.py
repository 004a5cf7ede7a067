"""The headless agent: the one public API that the `gpuflex-node` CLI and the tray app drive.

    agent = Agent(settings)          # or Agent() for the saved settings
    agent.start()                    # background thread: register, heartbeat, claim, train
    agent.pause(); agent.resume()
    agent.status()                   # an immutable snapshot, safe from any thread
    agent.subscribe(callback)        # log lines and state changes
    agent.stop()

The agent is the service shell (start, stop, pause, settings, login, local datasets, status
and log: what the local API serves) and the loop that wires its parts, each in its own module:
- desktop.presence: registration and heartbeats;
- desktop.task_pipeline: claim, fetch, train in the sandbox, upload, and an overlap task's
  continuation;
- desktop.lane_host: a multi-GPU host's lanes, one Agent per GPU (desktop.lanes);
- desktop.warm_keeper: when the warm task worker runs;
- desktop.agent_status: the status and log snapshots it shows.

Loop: register (once, with the provider key) → heartbeat (own thread) → claim (long poll) →
download → train in the sandbox → validate → upload, or report the failure with its reason.
Every step is journaled first (desktop.journal), so a crash anywhere resumes where it was.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from desktop import __version__, emulated_gpu, local_datasets, runtime_keeper
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
from desktop.hardware import GpuInfo, HardwareReport
from desktop.input_cache import InputCache
from desktop.journal import Journal
from desktop.lane_host import LaneHost
from desktop.lanes import lane_env, lane_scope, plan_lanes
from desktop.local_datasets import LocalDataset
from desktop.netprobe import NetProbe
from desktop.policy import Decision, Observations, WorkPolicy, decide, observe
from desktop.presence import Presence, registration_hardware
from desktop.probe import probe
from desktop.proof_keeper import ProofKeeper
from desktop.runtime.active import Runtime
from desktop.sandbox import Limits, Sandbox
from desktop.task_pipeline import CONTINUED, TaskPipeline
from desktop.warm_keeper import WarmKeeper

log = logging.getLogger("gpuflex.agent")

__all__ = ["Agent", "AgentStatus", "Event", "LaneStatus", "LogEntry", "State", "TaskStatus",
           "registration_hardware"]  # fmt: skip

# how often a running task re-checks the work policy: a game that starts is noticed within
# this, and the task pauses within the sandbox's PAUSE_GRACE_S more (the owner's 2 s)
POLICY_CHECK_S = 0.5


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
        makes them, see desktop.lane_host); otherwise it is the machine's one agent."""
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
        # > 0: a bench's emulated GPU of a fixed speed, seconds per sample (desktop.emulated_gpu)
        self.emulated_sample_s = emulated_gpu.sample_s()
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
        # uploaded tasks' checkpoints, revealed when a segment check asks (desktop.proof_keeper)
        self.proofs = ProofKeeper(self.paths.proofs)
        self.pipeline = TaskPipeline(self)  # claim, fetch, train, upload (desktop.task_pipeline)
        self.lane_host = LaneHost(self)  # a multi-GPU host's lanes (desktop.lane_host)
        self.client: MarketplaceClient | None = None
        self.simnet: SimulatedNetwork | None = None
        self.zone: Any = None  # desktop.zone_server.ZoneService while this node aggregates
        self.warm: WarmKeeper | None = None  # starts and stops the sandbox's warm worker
        self.runtime: Runtime | None = None  # what its tasks train with (runtime_keeper)
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

    def tasks(self, n: int = 50) -> list[dict[str, Any]]:
        """The last `n` tasks this machine took, newest first, with what became of each
        (Journal.summary; a multi-GPU host's lanes' together, each with its GPU's index)."""
        rows = [
            Journal.summary(r) | {"gpu": a._lane.index if a._lane is not None else None}
            for a in self.members()
            for r in a.journal.recent(n)
        ]
        return sorted(rows, key=lambda row: row["updated"], reverse=True)[:n]

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
                self.lane_host.run(gpus)
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
            self.pipeline.end_overlap()
            if self.client is not None:
                self.client.close()
            if self._sandbox is not None:
                self._sandbox.close()  # the warm task worker goes with the agent
            self._write_status_file()

    # ----------------------------------------------------------------- internals: setup

    def _probe_machine(self) -> None:
        """This machine's hardware and (unless given) benchmark, from a child process."""
        if self._lane is not None:
            return  # the host gave this lane its GPU's hardware and benchmark
        s = self._settings
        self._info(f"GPUFlex agent {__version__} starting; marketplace {s.server_url}")
        runtime_keeper.ensure(self)  # a pack on first need, for the probe's torch too
        if self._hardware is None or self._bench is None:
            # in a child process: the agent itself never imports torch (see desktop.probe)
            measure = self._bench is None
            if measure:
                self._info("benchmarking this machine (cached after the first run)…")
            hw, bench, cached = probe(self.paths.cache, quick=True, measure=measure,
                                      packages=runtime_keeper.pack_packages(self))  # fmt: skip
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
        # the training runtime its tasks run with: a pack, fetched on first need, or this
        # environment's torch (desktop/runtime_keeper.py)
        self.runtime = runtime_keeper.prepare(self)
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
                self.pipeline.release_overdue(self._pause_reason)
                self._sleep(self.idle_sleep_s)
                continue
            decision = self._policy()
            if not decision.allowed:
                if self.status().state is not State.WAITING:
                    self._info(f"waiting: {decision}")
                self._set(state=State.WAITING, reason=str(decision), task=None)
                self.pipeline.release_overdue(str(decision))
                self._sleep(self.idle_sleep_s * 5)
                continue
            try:
                self.pipeline.step()
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
        cont = self.pipeline.continuation
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
