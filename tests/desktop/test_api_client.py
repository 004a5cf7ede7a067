"""The REST client: contract paths, backoff with jitter, and the simulated-network transport."""

from __future__ import annotations

import gzip
import random

import httpx
import pytest
from fake_marketplace import PROVIDER_KEY, digits_task

from desktop.client import ApiError, Backoff, MarketplaceClient, SimulatedNetwork, Unavailable

FAST = Backoff(base_s=0.01, cap_s=0.05, attempts=5)


def test_backoff_grows_exponentially_with_jitter() -> None:
    b = Backoff(base_s=1, cap_s=30)
    rng = random.Random(0)
    for attempt in range(8):
        d = [b.delay(attempt, rng) for _ in range(50)]
        assert all(0.5 <= x <= min(30, 2**attempt) for x in d)
    assert len({round(b.delay(5, rng), 6) for _ in range(20)}) > 1  # jittered


def test_contract_round_trip(market) -> None:
    task = digits_task("c-1")
    market.add(task)
    c = MarketplaceClient(market.url, backoff=FAST)
    node = c.register(PROVIDER_KEY, {"name": "n"})
    c.node_key = node["node_key"]
    assert c.heartbeat({"state": "idle"})["heartbeat_interval_s"] > 0
    got = c.claim(1)
    assert got is not None and got["id"] == "c-1"
    assert c.get_model("c-1") == task.model and c.get_shard("c-1") == task.shard
    c.fail("c-1", "cancelled", "test")
    assert task.failed == [{"reason": "cancelled", "detail": "test"}]
    assert c.claim(1) is None  # 204
    assert c.me()["earnings"]["total"] == "0.00"
    c.close()


def test_4xx_is_not_retried_and_names_the_problem(market) -> None:
    c = MarketplaceClient(market.url, "gfx_n_wrong", backoff=FAST)
    with pytest.raises(ApiError) as err:
        c.claim(0)
    assert err.value.status == 401 and "wrong" in err.value.detail
    assert len(market.requests) == 1


def test_429_honours_retry_after_and_5xx_are_retried(market) -> None:
    c = MarketplaceClient(market.url, market.register_node(), backoff=FAST)
    market.fail_next(2, 500)
    market.fail_next(1, 429)
    retries: list[str] = []
    c.on_retry = retries.append
    assert c.claim(0) is None
    assert len(retries) == 3


def test_gives_up_after_its_attempts_with_unavailable() -> None:
    c = MarketplaceClient("http://127.0.0.1:9", "k", backoff=FAST)  # nothing listens on 9
    with pytest.raises(Unavailable):
        c.claim(0)


def test_simulated_network_adds_latency_loss_and_outages(market) -> None:
    slept: list[float] = []
    net = SimulatedNetwork("wan", node=3, seed=1, sleep=slept.append)
    c = MarketplaceClient(market.url, market.register_node(), transport=net, backoff=FAST)
    for _ in range(30):
        c.heartbeat({"state": "idle"})
    assert net.injected["delay_s"] > 30 * net.node.rtt_s * 0.99  # at least one RTT each
    assert all(s >= net.node.rtt_s * 0.99 for s in slept)
    net.go_dark()
    with pytest.raises(Unavailable):
        c.heartbeat({"state": "idle"})
    assert net.injected["dark"] >= 1


def test_simulated_disconnects_follow_the_trainer_model() -> None:
    net = SimulatedNetwork("flaky", node=0, seed=0, inner=httpx.MockTransport(lambda r: None))
    drops = [net.begin_round(r) for r in range(200)]
    frac = sum(d is not None for d in drops) / len(drops)
    assert 0.1 < frac < 0.3  # flaky: 0.2 per round
    assert SimulatedNetwork("lan").begin_round(1) is None


def test_unknown_profile_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown network profile"):
        SimulatedNetwork("moon")


def gzip_server(body: bytes) -> httpx.MockTransport:
    """A server that sends `body` gzip-encoded, as the marketplace sends shards."""
    packed = gzip.compress(body)

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"Content-Encoding": "gzip", "Content-Length": str(len(packed))},
            stream=httpx.ByteStream(packed),
        )  # fmt: skip

    return httpx.MockTransport(handle)


def test_a_gzip_encoded_download_is_decoded_once_and_timed_on_its_wire_bytes() -> None:
    body = bytes(40_000)  # compresses to a few dozen bytes
    slept: list[float] = []
    net = SimulatedNetwork("wan", node=3, seed=0, inner=gzip_server(body), sleep=slept.append)
    net._rng.random = lambda: 1.0  # type: ignore[method-assign]  # no simulated packet loss
    c = MarketplaceClient("http://market", "k", transport=net, backoff=FAST)
    shard = c.get_shard("t-1")
    assert shard == body
    assert 0 < shard.wire_bytes < 200
    # the link carried the encoded bytes: one RTT and well under the 40 kB's transfer time
    assert slept[-1] < net.node.transfer_s(4_000, upload=False)
    plain = MarketplaceClient("http://market", "k", transport=gzip_server(body), backoff=FAST)
    got = plain.get_model("t-1")
    assert got == body and got.wire_bytes == shard.wire_bytes


def test_the_link_probe_moves_the_bytes_asked_for(market) -> None:
    c = MarketplaceClient(market.url, market.register_node(), backoff=FAST)
    down = c.probe_down(20_000)
    assert len(down) == down.wire_bytes == 20_000
    c.probe_up(b"\x01" * 20_000)
