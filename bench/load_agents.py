"""Locust file of the load bench (bench/load_bench.py runs it headless, one phase a run):
simulated agents against `gpuflex serve`. Never imported by the bench itself: importing
locust patches the process with gevent.

    LOAD_PHASE   baseline | heartbeat | claims | schedule
    LOAD_KEYS    a JSON file: the node keys, one simulated agent each
    LOAD_OUT     a JSON file this writes as it quits: task ids per node, first/last times
    LOAD_PACE_S  seconds between one agent's requests (baseline, heartbeat, claims)
    LOAD_TASKS   schedule: tasks each agent claims before it stops
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from typing import Any

import gevent.event
from locust import FastHttpUser, constant, constant_pacing, events, task
from locust.exception import StopUser

PHASE = os.environ["LOAD_PHASE"]
with open(os.environ["LOAD_KEYS"]) as _f:
    KEYS: list[str] = json.load(_f)
PACE_S = float(os.environ.get("LOAD_PACE_S", "1"))
PER_AGENT = int(os.environ.get("LOAD_TASKS", "10"))
MAX_CLAIM = 8  # scheduling.MAX_CLAIM_BATCH

_ids = itertools.count()
_all_spawned = gevent.event.Event()
# node key index -> task ids its claims got; first request sent / last answer received
_claimed: dict[int, list[str]] = {}
_times = {"first": None, "last": None}
BEAT = {
    "state": "idle",
    "metrics": {"gpu_util": 0.1, "gpu_temp_c": 50, "gpu_mem_used_mb": 100},
    "network": {"rtt_ms": 1, "up_mbps": 1000, "down_mbps": 1000},
}


@events.spawning_complete.add_listener
def _spawned(user_count: int, **kw: Any) -> None:
    _all_spawned.set()


@events.quitting.add_listener
def _write(environment: Any, **kw: Any) -> None:
    with open(os.environ["LOAD_OUT"], "w") as f:
        json.dump({"claimed": _claimed, "first": _times["first"], "last": _times["last"]}, f)


class Agent(FastHttpUser):
    # scheduling: each agent claims again at once until it holds its tasks
    wait_time = constant(0) if PHASE == "schedule" else constant_pacing(PACE_S)

    def on_start(self) -> None:
        self.index = next(_ids) % len(KEYS)
        self.auth = {"Authorization": f"Bearer {KEYS[self.index]}"}
        self.held: list[str] = _claimed.setdefault(self.index, [])
        if PHASE == "schedule":
            _all_spawned.wait()  # every agent starts at once: the scheduling is timed
        else:  # spread the agents over one pace, as real heartbeats are
            gevent.sleep(PACE_S * (self.index % 1000) / 1000)

    @task
    def act(self) -> None:
        if PHASE == "baseline":
            # the cheapest answer the server gives: no key, a 401 before any database or
            # cache (permission fails before the throttles run)
            with self.client.get("/api/v1/nodes/", catch_response=True, name="401") as r:
                if r.status_code == 401:
                    r.success()
                else:
                    r.failure(f"status {r.status_code}")
        elif PHASE == "heartbeat":
            self.client.post("/api/v1/agent/heartbeat", json=BEAT, headers=self.auth,
                             name="heartbeat")  # fmt: skip
        else:
            self._claim()

    def _claim(self) -> None:
        want = MAX_CLAIM if PHASE == "claims" else min(MAX_CLAIM, PER_AGENT - len(self.held))
        if want <= 0:
            raise StopUser()
        started = time.time()
        headers = self.auth | {"Idempotency-Key": uuid.uuid4().hex}  # as the agent claims
        with self.client.post(f"/api/v1/agent/claim?max={want}", headers=headers,
                              catch_response=True, name="claim") as r:  # fmt: skip
            if r.status_code == 200:
                self.held.extend(t["id"] for t in r.json()["tasks"])
                r.success()
            elif r.status_code == 204:  # no work left: not a failure, but no lease
                r.success()
                if PHASE == "schedule":
                    raise StopUser()
            else:
                r.failure(f"status {r.status_code}")
        first = _times["first"]
        _times["first"] = started if first is None else min(first, started)
        _times["last"] = time.time()
