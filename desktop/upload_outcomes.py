"""What became of this node's uploads that the marketplace answered 202: received, to be
checked by its worker, which may still refuse them (a norm too large, too little privacy
noise, a corrupt codec payload). The agent asks (`GET agent/tasks/{id}/update`) when it next
talks to the server before a claim, a few times with growing gaps, then stops: an upload
refused after its 202 is recorded in the journal (outcome `refused`, the server's reason),
logged as an error, and counted failed rather than completed in the status.

    outcomes = UploadOutcomes(agent)
    # after a 202 the pipeline journals the task done with check="checking"
    outcomes.ask_due(client)        # before a claim: asks for those whose gap has passed
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from desktop.client import ApiError, MarketplaceClient, Unavailable
from desktop.journal import TaskRecord

# the agent these outcomes are recorded on (desktop.agent.Agent), named but not imported:
# the agent imports the pipeline that makes this, and the import graph has no circles
Agent = Any

# seconds after the upload (then after each answer of `checking`) before the next ask: about
# ten minutes in all, longer than the server waits for a check before it releases the lease
# (GPUFLEX_LEASE_TIMEOUT_S, 300 s by default), which ends the wait with a refusal
ASK_GAPS_S = (5.0, 15.0, 30.0, 60.0, 120.0, 240.0, 300.0)


class UploadOutcomes:
    def __init__(
        self,
        node: Agent,
        now: Callable[[], float] = time.time,
        gaps_s: tuple[float, ...] = ASK_GAPS_S,
    ) -> None:
        self.node = node
        self._now = now
        self.gaps_s = gaps_s

    def waiting(self) -> list[TaskRecord]:
        return [r for r in self.node.journal.finished() if r.check == "checking"]

    def ask_due(self, client: MarketplaceClient) -> None:
        """Ask about each watched upload whose gap has passed. The server away: asked on a
        later pass; a 404 (a server that keeps no outcomes, or has forgotten the task): no
        more asking."""
        now = self._now()
        for rec in self.waiting():
            if now < rec.updated + self.gaps_s[min(rec.check_asks, len(self.gaps_s) - 1)]:
                continue
            if not self.ask(client, rec):
                return  # the loop's next request says so; nothing is lost by waiting

    def ask(self, client: MarketplaceClient, rec: TaskRecord) -> bool:
        """Ask once about `rec`'s upload and record the answer; False when the server is
        away. Also asked at once when a claim hands the agent a task it is still waiting on:
        the server leased it anew, so the upload it holds was refused (or lost), and the new
        claim's record must not bury why."""
        try:
            outcome = client.upload_outcome(rec.id)
        except Unavailable:
            return False
        except ApiError as exc:
            if exc.status == 404:
                self.node.journal.record(rec.id, "done", check="unknown")
            else:
                self._asked(rec)
            return True
        status = outcome.get("status")
        if status == "accepted":
            self.node.journal.record(rec.id, "done", check="accepted")
        elif status == "refused":
            self._refused(rec, str(outcome.get("reason") or "no reason given"))
        else:  # still checking
            self._asked(rec)
        return True

    def _asked(self, rec: TaskRecord) -> None:
        asks = rec.check_asks + 1
        if asks >= len(self.gaps_s):  # bounded: the server's own lease expiry has passed
            self.node.journal.record(rec.id, "done", check="unknown", check_asks=asks)
            self.node._warn(f"task {rec.id}: the marketplace has not said whether it accepted "
                            "the upload; no longer asking")  # fmt: skip
        else:
            self.node.journal.record(rec.id, "done", check_asks=asks)

    def _refused(self, rec: TaskRecord, reason: str) -> None:
        self.node.journal.record(rec.id, "done", outcome="refused", check="refused",
                                 refusal=reason[:300])  # fmt: skip
        self.node._error(f"task {rec.id}: the marketplace refused its upload after checking "
                         f"it: {reason}")  # fmt: skip
        st = self.node.status()  # counted uploaded (completed) when it was sent: failed now
        self.node._set(completed=max(st.completed - 1, 0), failed=st.failed + 1)
        self.node._emit(("task_done", {"id": rec.id, "outcome": "refused", "ok": False,
                                       "reason": reason}))  # fmt: skip
