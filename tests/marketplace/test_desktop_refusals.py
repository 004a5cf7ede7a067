"""The real contributor agent learns that the real marketplace refused its upload after
answering 202 (the worker's check), and shows why: its journal, its status and its log
(desktop.upload_outcomes)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable

import pytest
from celery import current_app

from marketplace.jobs.models import Job
from marketplace.rounds.models import RefusedUpdate
from marketplace.rounds.update_checks import check_received
from marketplace.server.routing import CHECK_UPDATE
from tests.live_agents import live_agent
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def _wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    """Guards against hanging only; nothing here asserts how fast."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _refusals(events: list) -> list[dict]:
    return [e[1] for e in list(events) if e[0] == "task_done" and e[1]["outcome"] == "refused"]


def test_a_real_agent_learns_why_its_upload_was_refused(
    live_server, make_user, submit, tmp_path, monkeypatch
) -> None:
    _, provider_key = make_user("provider")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["rounds"] = {"max_rounds": 1}
    job = submit(spec=spec, tier="platform")
    # the worker's check is held back (as a busy worker would), to be run below
    sent: list[str] = []
    monkeypatch.setattr(current_app.tasks[CHECK_UPDATE], "delay", sent.append)
    agent = live_agent(tmp_path, "agent-0", live_server.url, provider_key, monkeypatch)
    agent.pipeline.outcomes.gaps_s = (0.2,) * 50  # asked often: the test stays short
    events: list = []
    agent.subscribe(events.append)
    said: list[str] = []  # the status's last error as the refusal is told: a later task's
    # crash may replace it since

    def on_refusal(event: tuple) -> None:
        if event[0] == "task_done" and event[1]["outcome"] == "refused":
            said.append(agent.status().last_error)

    agent.subscribe(on_refusal)
    agent.start()
    try:
        _wait(lambda: sent, 240, "an upload received")
        # the agent checked its update against the norm limit it was given; the worker's
        # check is stricter here (the limit lowered under it: a stand-in for any check the
        # agent cannot make), so it refuses what the agent sent
        stored = Job.objects.get(pk=job["id"])
        stored.spec["aggregation"] = stored.spec["aggregation"] | {"max_update_norm": 1e-9}
        stored.save(update_fields=["spec"])
        check_received(sent[0])
        # waited on by its event, not the failed count: the job's other tasks, claimed with
        # the lowered limit, fail on the agent's own check and count failed too
        _wait(lambda: _refusals(events), 120, "the agent to learn of the refusal")
    finally:
        agent.stop()
    done = _refusals(events)
    refused = RefusedUpdate.objects.get(task_id=done[0]["id"], node__name="agent-0")
    assert refused.reason.startswith("upload refused (norm)")
    assert done[0]["reason"] == refused.reason
    # the journal (append-only: the agent may have taken the task again since) says why
    entries = [json.loads(line) for line in agent.paths.journal.read_text().splitlines()]
    assert any(e["id"] == done[0]["id"] and e.get("outcome") == "refused"
               and e.get("refusal") == refused.reason for e in entries)  # fmt: skip
    assert refused.reason in said[0]
    assert any(refused.reason in e.message for e in agent.logs(500) if e.level == "error")
