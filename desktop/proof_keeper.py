"""An uploaded task's proof of learning, kept until the marketplace may ask for it.

A training task's runner leaves its boundary checkpoints in the task's folder
(desktop.task_runner.CHECKPOINT) and commits to them in the update's metadata. The folder goes
once the update is uploaded, so the agent moves the checkpoints here first (`keep`); when a
segment check asks for some (GET agent/proofs, marketplace/proofs), `reveal_pending` sends
them as they are, byte for byte (the server checks them against the commitments). A task's
checkpoints go once all its asked steps are sent, and in any case after MAX_AGE_S, beyond
MAX_TASKS tasks or MAX_BYTES: a check comes within minutes of the upload, and a node that
cannot reveal fails it, so keeping more is never worth an owner's disk.

No torch here: the files are moved and sent, never parsed.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from desktop.client import ApiError, Unavailable
from desktop.task_outputs import UnsafeOutput, copy_output
from desktop.task_runner import CHECKPOINT

log = logging.getLogger("gpuflex.agent")

MAX_TASKS = 16
MAX_BYTES = 2 * 2**30
MAX_AGE_S = 24 * 3600.0
POLL_S = 5.0  # how often the loop asks whether a check wants checkpoints
# asked only this long after the last upload it kept checkpoints for: the server draws a check
# as the upload arrives and gives the node minutes to reveal (GPUFLEX_SEGMENT_REVEAL_S), so a
# node with nothing recent asks nothing and costs the server no request
ASK_FOR_S = 3600.0
_NAME = re.compile(r"^checkpoint\.(\d{1,9})\.safetensors$")
_TASK = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class ProofKeeper:
    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self._clock = clock
        self._polled = 0.0
        # the newest task it holds (an agent restarted between an upload and its check still
        # answers); none: nothing to be asked about
        held = [p.stat().st_mtime for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        self._kept_at = max(held, default=-ASK_FOR_S)

    def keep(self, task_id: str, folder: Path) -> int:
        """Move the task's checkpoints out of its folder before it goes; returns how many."""
        if not _TASK.match(task_id):
            return 0
        names = [p.name for p in folder.glob("checkpoint.*.safetensors") if _NAME.match(p.name)]
        target = self.root / task_id
        kept = 0
        for name in names:
            try:  # a regular file only: a task's symlink is never followed out of its folder
                copy_output(folder, name, target / name)
                kept += 1
            except (UnsafeOutput, OSError) as exc:
                log.warning("task %s: checkpoint %s not kept (%s)", task_id, name, exc)
        if kept:
            self._kept_at = self._clock()
        self.prune()
        return kept

    def prune(self) -> None:
        """Oldest first, beyond the count, the bytes or the age."""
        if not self.root.is_dir():
            return
        tasks = sorted(
            (p for p in self.root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
        )
        sizes = {p: sum(f.stat().st_size for f in p.iterdir() if f.is_file()) for p in tasks}
        now, total = self._clock(), sum(sizes.values())
        for i, task in enumerate(tasks):
            left = len(tasks) - i
            if left <= MAX_TASKS and total <= MAX_BYTES and now - task.stat().st_mtime <= MAX_AGE_S:
                continue
            total -= sizes[task]
            shutil.rmtree(task, ignore_errors=True)

    def reveal_pending(self, client: object, force: bool = False) -> int:
        """Send what the marketplace's segment checks ask for (at most every POLL_S);
        returns the checkpoints sent. A missing one is not sent: the check then fails."""
        now = self._clock()
        if not force and (now - self._polled < POLL_S or now - self._kept_at > ASK_FOR_S):
            return 0
        self._polled = now
        sent = 0
        try:
            requests = client.proof_requests()  # type: ignore[attr-defined]
        except Unavailable:
            raise
        except ApiError as exc:  # an older server has no such endpoint: nothing to reveal
            log.debug("no proof requests: %s", exc)
            return 0
        for request in requests:
            task_id = str(request.get("task_id", ""))
            if not _TASK.match(task_id):
                continue
            folder = self.root / task_id
            for step in request.get("steps") or []:
                path = folder / CHECKPOINT.format(int(step))
                try:
                    data = path.read_bytes()
                except OSError:
                    log.warning("task %s: checkpoint %s asked for, not kept", task_id, step)
                    continue
                try:
                    client.put_checkpoint(request["id"], int(step), data)  # type: ignore[attr-defined]
                    sent += 1
                except Unavailable:
                    raise
                except ApiError as exc:
                    log.warning("task %s: checkpoint %s refused (%s)", task_id, step, exc)
            with contextlib.suppress(OSError):  # asked once per upload: never needed again
                shutil.rmtree(folder)
        return sent
