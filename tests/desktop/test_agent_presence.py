"""Presence alone (desktop.presence): registration and heartbeats against the fake
marketplace, with no claim loop, no sandbox and no agent thread running (#32 item 3)."""

from __future__ import annotations

import threading

from fake_marketplace import PROVIDER_KEY

from desktop.agent import Agent, State
from desktop.client import Backoff, MarketplaceClient
from desktop.config import Credentials
from desktop.presence import Presence

FAST = Backoff(base_s=0.01, cap_s=0.05, attempts=2)


def _presence(settings, paths, bench, hardware) -> tuple[Presence, Agent]:
    node = Agent(settings, paths, bench=bench, hardware=hardware, backoff=FAST)  # never started
    node.client = MarketplaceClient(settings.server_url, None, backoff=FAST,
                                    stop=threading.Event())  # fmt: skip
    return Presence(node), node


def test_presence_registers_once_and_keeps_the_key(
    market, logged_in, isolated_dirs, fake_bench, hardware
) -> None:
    presence, node = _presence(logged_in, isolated_dirs, fake_bench, hardware)
    assert presence.register()
    assert len(market.registrations) == 1
    body = market.registrations[0]
    assert body["name"] == "test-node" and body["benchmark"]["fp32_tflops"] == 0.1
    assert body["hardware"]["isolation"] == "limits"  # no sandbox yet: it confines nothing
    key = Credentials(isolated_dirs).node_key(market.url)
    assert key and key.startswith("gfx_n_") and node.client.node_key == key
    assert node.status().registered and node.status().state is State.IDLE
    assert node.status().node_id == Credentials(isolated_dirs).node_id(market.url)

    again, _ = _presence(logged_in, isolated_dirs, fake_bench, hardware)
    again.node.client.node_key = key  # as the agent's setup passes the stored key
    assert again.register()
    assert len(market.registrations) == 1  # a node key held: no second node


def test_a_heartbeat_carries_the_state_and_takes_the_interval(
    market, logged_in, isolated_dirs, fake_bench, hardware
) -> None:
    presence, node = _presence(logged_in, isolated_dirs, fake_bench, hardware)
    assert presence.last_beat is None
    presence.beat()  # not registered yet: nothing to send
    assert market.heartbeats == [] and presence.last_beat is None

    assert presence.register()
    node.pause("gaming")
    node.journal.record("t-1", "claimed", task={"id": "t-1"})
    presence.beat()
    beat = market.heartbeats[-1]
    assert beat["state"] == "paused" and beat["reason"] == "paused by you: gaming"
    assert beat["task_ids"] == ["t-1"]
    assert presence.last_beat is not None and presence.last_beat[1] == ""
    assert presence.interval_s == 0.5  # the marketplace's heartbeat_interval_s

    market.fail_next(10)  # the marketplace answers 503: the beat records why it failed
    presence.beat()
    assert presence.last_beat is not None and "503" in presence.last_beat[1]


def test_without_a_provider_key_registration_waits_for_a_login(
    market, logged_in, isolated_dirs, fake_bench, hardware
) -> None:
    Credentials(isolated_dirs).set_provider_key(None)
    presence, node = _presence(logged_in, isolated_dirs, fake_bench, hardware)
    done: list[bool] = []
    worker = threading.Thread(target=lambda: done.append(presence.register()), daemon=True)
    worker.start()
    try:
        _wait(lambda: node.status().state is State.ERROR)
        assert "not logged in" in node.status().reason and market.registrations == []
        Credentials(isolated_dirs).set_provider_key(PROVIDER_KEY)  # the owner logs in
        worker.join(60)
        assert done == [True] and len(market.registrations) == 1
    finally:
        node._stop.set()
        worker.join(10)


def _wait(cond, timeout: float = 60.0) -> None:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")
