"""The agent's claims carry an Idempotency-Key that is kept until an answer comes: re-sent
after a lost answer, in the same call or the loop's next one, a claim is one claim to the
server (tests/marketplace/test_claim_again.py holds the server's side)."""

from __future__ import annotations

import threading

import httpx
import pytest

from desktop.client import ApiError, Backoff, MarketplaceClient, Unavailable

FAST = Backoff(base_s=0.001, cap_s=0.002, attempts=3)
TASK = {"task": {"id": "t-1"}, "tasks": [{"id": "t-1"}]}


class Server:
    """Answers claims from a script: an exception to raise (a lost answer) or a status."""

    def __init__(self, *script: object) -> None:
        self.script = list(script)
        self.keys: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers["Idempotency-Key"])
        step = self.script.pop(0) if self.script else 204
        if isinstance(step, Exception):
            raise step
        if step == 200:
            return httpx.Response(200, json=TASK)
        return httpx.Response(int(step), json={"error": "x", "detail": "x"})


def _client(server: Server) -> MarketplaceClient:
    return MarketplaceClient("http://m", "gfx_n_k", transport=httpx.MockTransport(server),
                             backoff=FAST)  # fmt: skip


def test_a_claim_retried_after_a_lost_answer_sends_the_same_key() -> None:
    server = Server(httpx.ReadError("reset"), 503, 200)
    assert _client(server).claim(0) == TASK["task"]
    assert len(server.keys) == 3 and len(set(server.keys)) == 1
    assert 8 <= len(server.keys[0]) <= 64


def test_the_key_outlives_a_claim_that_got_no_answer_and_ends_with_one() -> None:
    server = Server(*[httpx.ConnectError("down")] * 3, 200, 204)
    client = _client(server)
    with pytest.raises(Unavailable):
        client.claim(0)
    assert client.claim(0) == TASK["task"]  # the loop's next claim: the same claim again
    assert len(set(server.keys[:4])) == 1
    assert client.claim(0) is None  # answered: the next claim is a new one
    assert server.keys[4] != server.keys[0]


def test_a_refused_claim_ends_its_key() -> None:
    server = Server(409, 204)
    client = _client(server)
    with pytest.raises(ApiError):
        client.claim(0)
    client.claim(0)
    assert server.keys[0] != server.keys[1]


def test_two_threads_never_share_a_pending_key() -> None:
    server = Server(*[httpx.ConnectError("down")] * 6)
    client = _client(server)

    def claim() -> None:
        with pytest.raises(Unavailable):
            client.claim(0)

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.keys) == 6 and len(set(server.keys)) == 2
