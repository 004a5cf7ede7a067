"""The task pipeline of one node: a claimed task from the marketplace to its uploaded update.

    pipeline = TaskPipeline(agent)   # the agent (desktop.agent) it works for
    pipeline.step()                  # one pass: the journal's open task, else claim one
    pipeline.process(rec)            # fetch → train in the sandbox → upload (or report why not)
    pipeline.release_overdue(why)    # while the node may not work: late tasks go back
    pipeline.end_overlap()           # as the agent stops

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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from desktop import local_datasets
from desktop.agent_status import State, TaskStatus
from desktop.client import ApiError, Stopped, Unavailable
from desktop.config import save_settings
from desktop.emulated_gpu import hold_s, samples_trained, step_s
from desktop.hardware import gpu_metrics
from desktop.journal import TaskRecord
from desktop.local_datasets import DatasetRefused, LocalDataset
from desktop.sandbox import Limits, SandboxResult, task_argv
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
    PROGRAM,
    PROGRESS,
    STOP,
)
from desktop.task_zygote import imports_for
from desktop.upload_outcomes import UploadOutcomes

# the agent that wires this part (desktop.agent.Agent), named but not imported: the agent
# imports its parts, and a part importing it back, even for typing, is an import circle
Agent = Any

log = logging.getLogger("gpuflex.agent")

TASK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # ids become folder names: no traversal
MAX_TRAIN_ATTEMPTS = 3  # a task that kills the sandbox this often is reported, not retried
FAIL_REASONS = {"oom", "timeout", "crashed", "sandbox", "cancelled"}
CONTINUED = ".continue"  # a continuation's folder: the task's id and this (see Continuation)


@dataclass
class Continuation:
    """Training on from an overlap task's local weights while its update uploads."""

    rec: TaskRecord  # the task whose update was sent
    folder: Path  # its own folder: the task's is the upload's, and goes when that is done
    stop: threading.Event = field(default_factory=threading.Event)  # a graceful stop wanted
    thread: threading.Thread | None = None
    uploader: threading.Thread | None = None


class TaskPipeline:
    """Claim, fetch, train, upload and continuation for one node (an agent, or one GPU's lane).
    Runs on the agent's loop thread; an overlap task's upload and continuation on their own."""

    def __init__(self, node: Agent) -> None:
        self.node = node
        self.continuation: Continuation | None = None
        self.uploading: set[str] = set()  # overlap tasks whose upload runs in the background
        self.outcomes = UploadOutcomes(node)

    def step(self) -> None:
        """One pass of the agent's loop while it may work: the journal's open task (one not
        uploading in the background) goes on, else a task is claimed (long poll) and run."""
        client = self.node.client
        assert client is not None
        pending = [r for r in self.node.journal.open() if r.id not in self.uploading]
        if pending:
            self.process(pending[0])
            return
        proofs = getattr(self.node, "proofs", None)
        if proofs is not None:  # segment checks asking for kept checkpoints (marketplace/proofs)
            proofs.reveal_pending(client)
        # uploads the server received (202) and checks later: accepted or refused, and why
        self.outcomes.ask_due(client)
        if not self.overlap_shown():  # else the status shows the continuation
            self.node._set(state=State.IDLE, reason="", task=None)
        task = client.claim(self.node.claim_wait_s)
        if task is not None:
            self.node._trace(str(task.get("id", "")), "claimed")
            if not self.hand_back_if_too_big(task):
                self.accept(task)

    def _deliver(self, rec: TaskRecord, data: bytes) -> tuple[int, bool]:
        """The update to the coordinator, or, for a task routed through its zone (`zone`),
        to the zone's aggregator after telling the coordinator its hash. Anything wrong on
        the zone's path (the aggregator gone, a refusal) falls back to the coordinator.
        Returns the status code, and whether the coordinator itself took the update."""
        assert self.node.client is not None
        zone = rec.task.get("zone")
        node_id = self.node.status().node_id
        if zone and node_id:
            try:
                self.node.client.hand_off(rec.id, int(zone["aggregator"]), rec.update_sha256)
                code = self.node.client.zone_upload(zone, rec.id, node_id, data, rec.metrics)
                return code, False
            except (ApiError, KeyError, ValueError, TypeError) as exc:
                if isinstance(exc, ApiError) and exc.status == 404:
                    raise  # the task is not ours any more: the flat upload would say the same
                self.node._warn(f"task {rec.id}: zone aggregator unusable ({exc}); uploading here")
        return self.node.client.put_update(rec.id, data, rec.metrics), True

    def accept(self, task: dict[str, Any]) -> None:
        tid = str(task.get("id", ""))
        if not TASK_ID.match(tid):
            self.node._error(f"the marketplace sent a task with an unusable id {tid[:40]!r}")
            return
        known = self.node.journal.get(tid)
        if known is None or known.state == "done":  # done before: the server leased it anew
            if known is not None and known.check == "checking":  # so the upload was refused
                assert self.node.client is not None
                self.outcomes.ask(self.node.client, known)
            self.node.journal.record(tid, "claimed", task=task, attempts=0, outcome="",
                                     check="", check_asks=0, refusal="")  # fmt: skip
            self.node._info(
                f"claimed task {tid} (job {task.get('job_id')}, round {task.get('round')})"
            )
        rec = self.node.journal.get(tid)
        assert rec is not None
        self.process(rec)

    def _free_memory_bytes(self) -> tuple[int, bool]:
        """(bytes a task may use now, whether on a GPU): the GPU's free memory, or on a CPU
        node the available RAM within the sandbox's limit."""
        hw = self.node._hardware
        gpu = hw.primary_gpu if hw is not None and hw.accelerator != "cpu" else None
        if gpu is not None:
            used = gpu_metrics(self.node._gpu_index, self.node._own_pids()).memory_used_mb or 0
            return max(gpu.memory_total_mb - used, 0) * 2**20, True
        import psutil

        limit = self.node._settings.task_memory_mb * 2**20
        return min(int(psutil.virtual_memory().available), limit), False

    def hand_back_if_too_big(self, task: dict[str, Any]) -> bool:
        """Check a claimed task's memory estimate (trainer.fit) against the free memory before
        taking it on; one that does not fit goes straight back, nothing downloaded."""
        from trainer.fit import check_task

        assert self.node.client is not None
        free, on_gpu = self._free_memory_bytes()
        reason = check_task(task, free, on_gpu)
        if reason is None:
            return False
        tid = str(task.get("id", ""))
        self.node._warn(f"task {tid} does not fit this machine ({reason}); handing it back")
        self.node.client.fail(tid, "oom", f"does not fit: {reason}"[:300])
        self.node._sleep(
            self.node.idle_sleep_s * 5
        )  # memory may free up; others may take it meanwhile
        return True

    def _folder(self, tid: str) -> Path:
        return self.node.paths.tasks / tid

    def _task_status(self, rec: TaskRecord, phase: str, progress: float = 0.0) -> TaskStatus:
        cur = self.node.status().task
        started = cur.started if cur is not None and cur.id == rec.id else time.time()
        return TaskStatus(
            rec.id, str(rec.task.get("job_id", "")), int(rec.task.get("round", 0) or 0),
            phase, progress, started,
        )  # fmt: skip

    def process(self, rec: TaskRecord) -> None:
        if self.node.warm is not None:
            self.node.warm.offered()  # torch imports in the worker while the inputs download
        try:
            self._process_task(rec)
        finally:
            if self.node.warm is not None:
                self.node.warm.used()

    def _process_task(self, rec: TaskRecord) -> None:
        assert self.node.client is not None
        if rec.state in ("claimed", "ready") and self.deadline_passed(rec.task):
            self._finish_failed(rec, "cancelled", "the task's deadline passed before it ran")
            return
        inputs = LOCAL_DATA if rec.task.get("local_dataset") else "shard.safetensors"
        if rec.state == "ready" and not (self._folder(rec.id) / inputs).exists():
            rec = self.node.journal.record(rec.id, "claimed")  # inputs lost (data folder wiped)
        if rec.state == "claimed":
            self.node._set(state=State.WORKING, task=self._task_status(rec, "downloading"))
            try:
                self._download(rec)
                self.node._trace(rec.id, "downloaded")
            except DatasetRefused as exc:  # a federated task's local dataset is gone or broken
                self.node._datasets_due.set()
                self._finish_failed(rec, "crashed", str(exc))
                return
            except ApiError as exc:
                if exc.status not in (403, 404, 410):
                    raise
                # the lease is gone (expired while we were down, or reassigned): drop it
                self.node._warn(f"task {rec.id} is no longer ours ({exc.code}); dropping it")
                self._done(rec, "lost", ok=False)
                return
            self._hand_progress(rec)
            rec = self.node.journal.record(rec.id, "ready", downloads=rec.downloads + 1)
        if rec.state == "ready":
            self._halt_continuation()  # the sandbox trains one thing at a time
            if rec.attempts >= MAX_TRAIN_ATTEMPTS:
                self._finish_failed(rec, "crashed", f"gave up after {rec.attempts} attempts")
                return
            self._train(rec)
            rec = self.node.journal.get(rec.id) or rec
            if rec.state == "claimed":  # the inputs came corrupt: fetch and train once more
                self.process(rec)
                return
        if rec.state == "trained":
            if self._may_overlap(rec):
                self._upload_and_continue(rec)
            else:
                self._upload(rec)

    def release_overdue(self, why: str) -> None:
        """While this node may not work, a task it holds past its deadline goes back to the
        marketplace at once, for another node to take: heartbeats would otherwise keep its
        lease alive for as long as the game goes on, and hold its round up."""
        st = self.node.status()
        for rec in self.node.journal.open():
            if (
                rec.state in ("claimed", "ready")
                and rec.id not in self.uploading
                and self.deadline_passed(rec.task)
            ):
                with contextlib.suppress(Unavailable):  # reported on a later pass
                    self._finish_failed(rec, "cancelled", f"not run by its deadline: {why}")
                self.node._set(
                    state=st.state, reason=st.reason
                )  # still waiting, for the same reason

    def deadline_passed(self, task: dict[str, Any]) -> bool:
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
        assert self.node.client is not None
        folder = self._folder(rec.id)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("model*.safetensors"):
            stale.unlink()
        self._fetch_model(rec, folder)
        if rec.task.get("local_dataset"):  # federated: the node's own data, never downloaded
            self._local_input(rec, folder)
        elif self.node.inputs.copy_to(rec.task.get("shard_hash"), folder / "shard.safetensors"):
            # this node holds a shard with the task's content hash (any job's, any round's)
            self.node._trace(rec.id, "shard_cached")
        else:
            shard = self._timed_get(self.node.client.get_shard, rec.id)
            (folder / "shard.safetensors").write_bytes(shard)
        if rec.task.get("program"):  # an exported model: read in the sandbox, never here
            program = self._timed_get(self.node.client.get_program, rec.id)
            (folder / PROGRAM).write_bytes(program)
        (folder / "task.json").write_text(json.dumps(rec.task), encoding="utf-8")
        residual = self._residual_file(rec)
        if rec.task.get("codec") == "topk" and os.path.lexists(residual):
            try:  # a task wrote it once: copied as a regular file only (desktop.task_outputs)
                copy_output(residual.parent, residual.name, folder / "residual.safetensors")
            except UnsafeOutput as exc:
                self.node._warn(f"task {rec.id}: the kept residual is dropped ({exc})")
                residual.unlink(missing_ok=True)

    def _local_dataset(self, rec: TaskRecord) -> LocalDataset:
        """A federated task's local dataset, re-read first when its file changed since it
        was declared (its rows, schema and hash are then advertised anew)."""
        name = str(rec.task.get("local_dataset"))
        with self.node._lock:
            dataset = local_datasets.find(self.node._settings, name)
        if dataset is None:
            raise DatasetRefused(f"this node no longer holds a local dataset named {name!r}")
        if dataset.changed():
            self.node._info(f"local dataset {name!r} changed on disk; reading it again")
            dataset = local_datasets.inspect(name, dataset.path, dataset.kind,
                                             dataset.label_column, dataset.image_size)  # fmt: skip
            with self.node._lock:
                local_datasets.replace_entry(self.node._settings, dataset)
                save_settings(self.node._settings, self.node.paths)
            self.node._datasets_due.set()
        return dataset

    def _local_input(self, rec: TaskRecord, folder: Path) -> None:
        """Where the sandboxed runner reads the task's local dataset (desktop.task_runner)."""
        assert self.node._sandbox is not None
        d = self._local_dataset(rec)
        where = {
            "name": d.name,
            "kind": d.kind,
            "label_column": d.label_column,
            "image_size": d.image_size,
            "path": self.node._sandbox.data_path(d.name, Path(d.path)),
        }
        (folder / LOCAL_DATA).write_text(json.dumps(where), encoding="utf-8")
        self.node._info(f"task {rec.id} trains on local dataset {d.name!r} ({d.rows} rows)")

    def _fetch_model(self, rec: TaskRecord, folder: Path) -> None:
        """The round's model the way the task's `model_source` says: from the cache, built
        from the seed by the runner (nothing to fetch), as deltas against a model this node
        holds, or whole. A second download (the first came corrupt) is always whole."""
        assert self.node.client is not None
        cached = self.node.inputs.get(rec.task.get("model_hash"))
        if cached is not None:
            self.node._trace(rec.id, "model_cached")
            (folder / "model.safetensors").write_bytes(cached)
            return
        source = rec.task.get("model_source") or {}
        kind = source.get("kind") if rec.downloads == 0 else "full"
        if kind == "seed":
            self.node._info(f"task {rec.id}: the model is built here from the job's seed")
            return  # desktop.task_runner builds it and checks it against model_hash
        base = self.node.inputs.get(source.get("base")) if kind == "delta" else None
        chain = source.get("chain")
        if base is not None and isinstance(chain, list) and chain:
            (folder / "model.base.safetensors").write_bytes(base)
            held, size = str(source["base"]), 0
            for i, step in enumerate(chain):
                data = self._timed_get(
                    lambda tid, b=held: self.node.client.get_model(tid, b), rec.id
                )
                (folder / f"model.delta.{i}.safetensors").write_bytes(data)
                held, size = str(step), size + len(data)
            self.node._info(f"task {rec.id}: the model came as {len(chain)} delta(s), {size} bytes")
            self.node._trace(rec.id, "model_delta")
            return
        (folder / "model.safetensors").write_bytes(
            self._timed_get(self.node.client.get_model, rec.id)
        )

    def _job_file(self, kind: str, job_id: object) -> Path:
        """A file kept per job between its tasks, under data/`kind` (the id made a safe name)."""
        job = re.sub(r"[^A-Za-z0-9_.-]", "_", str(job_id or "job"))[:128]
        return self.node.paths.tasks.parent / kind / f"{job}.safetensors"

    def _residual_file(self, rec: TaskRecord) -> Path:
        """Top-k's error-feedback residual for the task's job, kept between its tasks."""
        return self._job_file("feedback", rec.task.get("job_id", "job"))

    def _timed_get(self, get: Callable[[str], bytes], tid: str) -> bytes:
        t0 = time.monotonic()
        data = get(tid)
        self.node.presence.timed(data, t0, upload=False)
        return data

    def _train(self, rec: TaskRecord) -> None:
        assert self.node._sandbox is not None
        folder = self._folder(rec.id)
        # an earlier attempt's outputs and pause request; its paused state stays, to resume
        for stale in ("update.safetensors", "result.json", PAUSE):
            (folder / stale).unlink(missing_ok=True)
        rec = self.node.journal.record(rec.id, "ready", attempts=rec.attempts + 1)
        # working again: whatever held it back (a game, the heat) is no longer the reason
        self.node._set(state=State.WORKING, reason="", task=self._task_status(rec, "training"))
        self.node._info(f"training task {rec.id} (attempt {rec.attempts})")
        drop_at = None
        if self.node.simnet is not None:
            drop_at = self.node.simnet.begin_round(int(rec.task.get("round", 0) or 0))
        self.node._policy_working = True
        policy_stop: list[str] = []

        def should_stop() -> str | None:
            if self.node._stop.is_set():
                return "the agent is stopping"
            if self.node._paused.is_set():
                return self.node._pause_reason
            return None

        def on_event(event: dict[str, Any]) -> None:
            nonlocal drop_at
            if isinstance(event.get("phase"), str) and isinstance(event.get("t"), float):
                self.node._trace(rec.id, f"runner_{event['phase']}", event["t"])
            if isinstance(note := event.get("note"), str):  # e.g. resuming from a pause
                self.node._info(f"task {rec.id}: {note[:200]}")
            progress = event.get("progress")
            if isinstance(progress, int | float):
                self.node._set(task=self._task_status(rec, "training", float(progress)))
                if drop_at is not None and progress >= drop_at and self.node.simnet is not None:
                    self.node._warn("simulated network: this node drops out of the round now")
                    self.node.simnet.go_dark()
                    drop_at = None

        s = self.node._settings
        self.node._sandbox.limits = Limits(
            memory_mb=s.task_memory_mb, cpu_s=s.task_cpu_s, wall_s=s.task_wall_s
        )
        self.node._sandbox.env["GPUFLEX_GPU_MEMORY_FRACTION"] = str(s.gpu_memory_fraction)
        self.node._sandbox.env[DUTY_ENV] = str(s.max_gpu_busy_pct / 100)
        self.node._sandbox.imports = imports_for(rec.task)  # DP-SGD's Opacus, kept warm
        if self.node.byzantine:
            self.node._sandbox.env[BYZANTINE_ENV] = self.node.byzantine
            from desktop.cheat_sources import put_source  # test hooks: only when attacking

            put_source(self.node.paths.data / "byzantine", self.node.byzantine, rec.task,
                       self._folder(rec.id))  # fmt: skip
        self.node._trace(rec.id, "sandbox_called")
        read_only = None
        if rec.task.get("local_dataset"):  # the local dataset, bound read-only (never copied)
            try:
                d = self._local_dataset(rec)
            except DatasetRefused as exc:
                self.node._policy_working = False
                self.node._datasets_due.set()
                self._finish_failed(rec, "crashed", str(exc))
                return
            read_only = {d.path: self.node._sandbox.data_path(d.name, Path(d.path))}
        try:
            stop = self._should_stop(should_stop, policy_stop)
            result = self.node._sandbox.run_task(folder, stop, on_event, read_only)
        finally:
            self.node._policy_working = False
        self.node._trace(rec.id, "sandbox_returned")
        if result.status == "cancelled":
            # kept as "ready": trained again later, from where it paused when it could save
            # its state, else from its start (training is deterministic either way)
            self.node.journal.record(rec.id, "ready", attempts=rec.attempts - 1)
            self.node._info(f"task {rec.id} interrupted: {result.detail}")
            return
        if result.status == CORRUPT_INPUT:
            source = rec.task.get("model_source") or {}
            self.node.inputs.drop(rec.task.get("model_hash"), rec.task.get("shard_hash"),
                             source.get("base"))  # fmt: skip
            if rec.downloads >= 2:
                self._finish_failed(rec, "crashed", f"inputs corrupt after two downloads: "
                                    f"{result.detail}")  # fmt: skip
            else:
                self.node._warn(
                    f"task {rec.id}: download {rec.downloads} is corrupt ({result.detail})"
                )
                self.node.journal.record(rec.id, "claimed", attempts=rec.attempts - 1)
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
            if time.monotonic() - last[0] >= self.node.policy_check_s:
                last[0] = time.monotonic()
                decision = self.node._policy()
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
                self.node.inputs.put(rec.task.get(key), source)
        try:  # the runner has checked the update against the model (desktop.task_runner)
            data = read_output(folder, "update.safetensors")
            metrics = numeric_metrics(read_json_output(folder, "result.json"))
        except UnsafeOutput as exc:  # its message names the file, never quotes its bytes
            self._finish_failed(rec, "crashed", f"the task produced an unusable update: {exc}")
            return
        if self.node.emulated_sample_s > 0:
            # a bench's emulated GPU: the task's compute takes the time its work fixes,
            # whatever this host's load made the real compute take (desktop.emulated_gpu)
            emulated = self.node.emulated_sample_s * samples_trained(rec.task, metrics)
            real = metrics.get("compute_s", 0.0)
            self.node._stop.wait(hold_s(real, emulated))
            metrics["compute_s"] = max(real, emulated)
        elif self.node.compute_scale > 1.0:
            # a simulated slower GPU takes longer for the same (bit-identical) result
            extra = (self.node.compute_scale - 1.0) * metrics.get("compute_s", 0.0)
            self.node._stop.wait(extra)
            metrics["compute_s"] = metrics.get("compute_s", 0.0) * self.node.compute_scale
        self.node.journal.record(
            rec.id, "trained", update_sha256=hashlib.sha256(data).hexdigest(), metrics=metrics
        )
        self.node._info(
            f"task {rec.id} trained: loss {metrics.get('loss', float('nan')):.4f}, "
            f"{metrics.get('compute_s', 0):.1f} s"
        )

    def _upload(self, rec: TaskRecord, background: bool = False) -> None:
        """`background`: beside the loop, for an overlap task (see _upload_and_continue)."""
        assert self.node.client is not None
        if not background:
            self.node._set(state=State.WORKING, task=self._task_status(rec, "uploading", 1.0))
        try:
            data = read_output(self._folder(rec.id), "update.safetensors")
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() != rec.update_sha256:
            # the file changed since it was journaled: never send other bytes than recorded
            self.node.journal.record(rec.id, "claimed")
            self.node._warn(f"task {rec.id}: update file lost or changed on disk; running it again")
            return
        session = None
        if uses_secagg(rec.task):  # the update leaves this node masked, or not at all
            session = SecAggSession(
                self.node.client, rec.task, stop=self.node._stop, log=self.node._info
            )
            try:
                data = session.masked_update(data)
            except Unavailable:
                raise  # the server is away: the task waits, as for any other request
            except (SecAggDropped, ProtocolError, ApiError) as exc:
                self._finish_failed(rec, "cancelled", f"secure aggregation: {exc}")
                return
        t0 = time.monotonic()
        try:
            self.node._trace(rec.id, "upload_started")
            code, direct = self._deliver(rec, data)
            self.node._trace(rec.id, "uploaded")
        except ApiError as exc:
            if isinstance(exc, Unavailable):
                raise
            if exc.status in (409, 422):  # refused once the body was in: it timed the link
                self.node.presence.timed(data, t0, upload=True)
            outcome = {404: "lost", 409: "conflict", 422: "rejected"}.get(exc.status or 0, "error")
            self.node._error(f"task {rec.id}: upload refused ({exc})")
            self._done(rec, outcome, ok=False, background=background)
            return
        self.node.presence.timed(data, t0, upload=True)
        self.node._info(f"task {rec.id} uploaded" + (" (already accepted)" if code == 200 else ""))
        proofs = getattr(self.node, "proofs", None)
        if proofs is not None:  # before the folder goes: a segment check may ask for them
            proofs.keep(rec.id, self._folder(rec.id))
        if self.node.byzantine:
            from desktop.cheat_sources import keep_sent  # test hooks: only when attacking

            keep_sent(self.node.paths.data / "byzantine", self.node.byzantine, rec.task,
                      self._folder(rec.id))  # fmt: skip
        if session is not None:
            try:
                session.unmask()
            except Unavailable:
                raise
            except (SecAggDropped, ProtocolError, ApiError) as exc:
                self.node._warn(f"task {rec.id}: secure aggregation's unmasking failed ({exc})")
        residual = self._folder(rec.id) / "residual.next.safetensors"
        if os.path.lexists(residual):  # only once the server has the update it complements
            try:  # copied from the opened file: a task's symlink is never carried onward
                copy_output(residual.parent, residual.name, self._residual_file(rec))
            except UnsafeOutput as exc:
                self.node._warn(f"task {rec.id}: its residual is dropped ({exc})")
        # received, not yet checked by the server's worker: asked about later (it may refuse)
        check = "checking" if code == 202 and direct else ""
        self._done(rec, "uploaded", ok=True, background=background, check=check)

    def _finish_failed(self, rec: TaskRecord, reason: str, detail: str) -> None:
        assert self.node.client is not None
        self.node._error(f"task {rec.id} failed ({reason}): {detail}")
        try:
            self.node.client.fail(rec.id, reason, detail[:1000])
        except Unavailable:
            raise  # the journal still says not done: reported on the next pass
        except ApiError as exc:
            self.node._warn(f"task {rec.id}: failure report refused ({exc})")
        self._done(rec, f"failed:{reason}", ok=False)

    def _done(
        self, rec: TaskRecord, outcome: str, ok: bool, background: bool = False, check: str = ""
    ) -> None:
        self.node.journal.record(rec.id, "done", outcome=outcome, check=check, check_asks=0)
        shutil.rmtree(self._folder(rec.id), ignore_errors=True)
        st = self.node.status()
        counts = {"completed": st.completed + (1 if ok else 0),
                  "failed": st.failed + (0 if ok else 1)}  # fmt: skip
        if not background:
            self.node._set(task=None, state=State.IDLE, **counts)
        elif st.task is not None and st.task.id == rec.id:  # the loop's own task is its own
            self.node._set(task=replace(st.task, phase="training on"), **counts)
        else:
            self.node._set(**counts)
        self.node._emit(("task_done", {"id": rec.id, "outcome": outcome, "ok": ok}))

    def _may_overlap(self, rec: TaskRecord) -> bool:
        """An overlap task whose runner left its local weights, with the agent free to go on."""
        return (
            rec.task.get("overlap") is True
            and is_regular(self._folder(rec.id), LOCAL)
            and not (self.node._stop.is_set() or self.node._paused.is_set())
        )

    def _upload_and_continue(self, rec: TaskRecord) -> None:
        """Upload in the background while a continuation trains on; the loop goes on to claim
        and download the next task. The journal still says `trained` until the upload is in,
        so a crash sends the very same bytes again; the continuation is never journaled."""
        self._halt_continuation()
        src = self._folder(rec.id)
        folder = self.node.paths.tasks / f"{rec.id}{CONTINUED}"
        try:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for name in ("task.json", "shard.safetensors", LOCAL):
                link_or_copy_output(src, name, folder / name)  # a symlink is refused
            if (src / PROGRAM).exists():  # an exported model's program
                link_or_copy_output(src, PROGRAM, folder / PROGRAM)
            # see task_runner._pace: the continuation's steps are slowed as they happen
            marker = {"task": rec.id, "pace": self.node.compute_scale,
                      "step_s": step_s(rec.task, self.node.emulated_sample_s)}  # fmt: skip
            (folder / CONTINUE).write_text(json.dumps(marker), encoding="utf-8")
        except OSError as exc:  # best effort: the upload is what counts
            self.node._warn(f"task {rec.id}: cannot train on while uploading ({exc})")
            shutil.rmtree(folder, ignore_errors=True)
            self._upload(rec)
            return
        cont = Continuation(rec, folder)
        cont.thread = threading.Thread(target=self._continue, args=(cont,), daemon=True,
                                       name="gpuflex-continuation")  # fmt: skip
        cont.uploader = threading.Thread(target=self._background_upload, args=(rec,),
                                         daemon=True, name="gpuflex-upload")  # fmt: skip
        self.uploading.add(rec.id)
        self.continuation = cont
        self.node._set(
            state=State.WORKING, task=self._task_status(rec, "uploading, training on", 0.0)
        )
        self.node._info(f"task {rec.id}: uploading, training on meanwhile")
        cont.thread.start()
        cont.uploader.start()

    def _background_upload(self, rec: TaskRecord) -> None:
        try:
            self._upload(rec, background=True)
        except (ApiError, Stopped) as exc:  # still `trained`: the loop sends it again
            self.node._warn(f"task {rec.id}: upload interrupted ({exc}); it will be sent again")
        finally:
            self.uploading.discard(rec.id)
            self.node._wake.set()

    def _continue(self, cont: Continuation) -> None:
        """Run the continuation; keep its progress for the job's next task (_hand_progress)."""
        assert self.node._sandbox is not None
        rec = cont.rec
        graceful = self._should_stop(
            lambda: "stop" if cont.stop.is_set() or self.node._paused.is_set() else None, []
        )

        def should_stop() -> str | None:
            if self.node._stop.is_set():
                return "the agent is stopping"  # no time to be graceful: its progress goes
            if graceful():
                cont.stop.set()
                self.node._sandbox.signal(cont.folder, STOP)  # again until seen: it may be moving
            return None

        def on_event(event: dict[str, Any]) -> None:
            progress = event.get("progress")
            st = self.node.status().task
            if isinstance(progress, int | float) and st is not None and st.id == rec.id:
                self.node._set(task=replace(st, progress=float(progress)))

        try:
            result = self.node._sandbox.run(cont.folder, task_argv(cont.folder.resolve()),
                                       should_stop, on_event)  # fmt: skip
            self._keep_progress(cont, result)
        except Exception as exc:  # best effort: a continuation never stops the agent
            log.exception("continuation failed")
            self.node._warn(f"task {rec.id}: training on failed ({exc}); its progress is dropped")
        finally:
            shutil.rmtree(cont.folder, ignore_errors=True)
            self.node._wake.set()

    def _keep_progress(self, cont: Continuation, result: SandboxResult) -> None:
        try:
            outcome = read_json_output(cont.folder, "result.json")
            steps = int(numeric_metrics(outcome)["steps"])
        except (OSError, ValueError, KeyError):
            outcome, steps = {}, 0
        rec = cont.rec
        if not result.ok or outcome.get("status") != "ok" or steps < 1 or self.node._stop.is_set():
            why = result.detail or "no steps done"
            self.node._info(f"task {rec.id}: trained on without usable progress ({why})")
            return
        target = self._progress_file(str(rec.task.get("job_id", "")))
        target.parent.mkdir(parents=True, exist_ok=True)
        meta = {"job_id": rec.task.get("job_id"), "round": rec.task.get("round"), "task": rec.id}
        try:  # copied from the opened file: a task's symlink is never carried onward
            copy_output(cont.folder, PROGRESS, target)
        except UnsafeOutput as exc:
            self.node._info(f"task {rec.id}: its progress is dropped ({exc})")
            return
        target.with_suffix(".json").write_text(json.dumps(meta), encoding="utf-8")
        self.node._info(f"task {rec.id}: trained on {steps} step(s) while uploading")

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
                self.node._info(f"task {rec.id}: starts from the model plus the progress made "
                           f"since task {meta['task']} was sent")  # fmt: skip
            data.unlink(missing_ok=True)
            meta_file.unlink(missing_ok=True)

    def _halt_continuation(self) -> None:
        """Stop a running continuation gracefully (the runner stops before its next step and
        keeps the steps done) and wait for it; its upload goes on."""
        cont = self.continuation
        if cont is None or cont.thread is None:
            return
        if cont.thread.is_alive():
            cont.stop.set()
            assert self.node._sandbox is not None
            self.node._sandbox.signal(cont.folder, STOP)
            cont.thread.join()
        self.continuation = None

    def overlap_shown(self) -> bool:
        """While nothing else runs, the status shows the continuation, if one trains or its
        task uploads."""
        cont = self.continuation
        if cont is None:
            return False
        training = cont.thread is not None and cont.thread.is_alive()
        uploading = cont.rec.id in self.uploading
        if not (training or uploading):
            return False
        phase = "uploading, training on" if uploading and training else (
            "uploading" if uploading else "training on")  # fmt: skip
        st = self.node.status().task
        progress = st.progress if st is not None and st.id == cont.rec.id else 0.0
        self.node._set(state=State.WORKING, reason="",
                  task=self._task_status(cont.rec, phase, progress))  # fmt: skip
        return True

    def end_overlap(self) -> None:
        """On the way out: the continuation (killed, as the agent stops) and the upload."""
        cont = self.continuation
        if cont is None:
            return
        for t in (cont.thread, cont.uploader):
            if t is not None and t is not threading.current_thread():
                t.join(30.0)
        self.continuation = None
