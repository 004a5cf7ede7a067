"""The agent's health, as the marketplace's /healthz and /readyz give it (docs/deploy.md):
the local API serves both. No torch here: the agent process never imports it.

Ready means: the agent runs, a provider key is stored (logged in), every node of this
machine reached the marketplace at its last heartbeat and not long ago, and its warm task
worker is up, or down by design: off on this platform, or stopped because no work wants it
("idle", desktop.warm_keeper)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from desktop.config import CredentialsDamaged

if TYPE_CHECKING:
    from desktop.agent import Agent

# a heartbeat older than this many intervals (and at least STALE_MIN_S) is a lost link
STALE_BEATS = 3
STALE_MIN_S = 30.0


def _login(agent: Agent) -> str:
    try:
        return "ok" if agent.credentials.provider_key() else "not logged in: no provider key"
    except CredentialsDamaged as exc:
        return f"not logged in: {exc}"


def _marketplace(agent: Agent, now: float) -> str:
    for member in agent.members():
        beat = member.last_heartbeat
        if beat is None:
            return "no heartbeat sent yet"
        when, error = beat
        if error:
            return f"the last heartbeat failed: {error}"[:300]
        stale = max(STALE_BEATS * member.heartbeat_interval_s, STALE_MIN_S)
        if now - when > stale:
            return f"the last heartbeat was {now - when:.0f} s ago"
    return "ok"


def _worker(agent: Agent) -> str:
    states = [member.warm_state() for member in agent.members()]
    if all(state in ("warm", "off", "idle") for state in states):
        return "ok"
    return "the warm task worker is not running yet (the next task starts it)"


def readiness(agent: Agent) -> tuple[bool, dict[str, Any]]:
    now = time.time()
    checks = {
        "agent": "ok" if agent.running else "stopped",
        "login": _login(agent),
        "marketplace": _marketplace(agent, now),
        "worker": _worker(agent),
    }
    failed = [name for name, state in checks.items() if state != "ok"]
    workers = [member.warm_state() for member in agent.members()]
    body = {"status": "unavailable" if failed else "ok", "checks": checks, "failed": failed,
            "warm_workers": workers}  # fmt: skip
    return not failed, body
