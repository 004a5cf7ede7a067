"""#38 finding 5 on a real `gpuflex serve` with two web workers: concurrent bad-key
guesses and sign-ups from one address pass no more than their rates, the rest get 429.

Before, each worker counted in its own memory and a burst passed the check before any of it
was counted: 96 concurrent guesses then switched the failure throttle off, and 47 sign-ups
passed a 10/hour limit. The server here is the embedded setup (its own SQLite, no Redis), so
the counts are shared through the data folder's counter file; with REDIS_URL they are in
Redis (tests/marketplace/test_throttles.py runs the same race on both stores)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUESS_LIMIT, SIGNUP_LIMIT = 5, 3


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """`gpuflex serve --workers 2` on a fresh data folder, with small per-hour rates."""
    with tempfile.TemporaryDirectory(prefix="gpuflex-throttle-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env |= {
            "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
            "GPUFLEX_DATA_DIR": tmp,
            "SECRET_KEY": secrets.token_urlsafe(48),
            "GPUFLEX_THROTTLE_AUTH_FAILURE": f"{GUESS_LIMIT}/hour",
            "GPUFLEX_THROTTLE_SIGNUP": f"{SIGNUP_LIMIT}/hour",
        }
        port = _free_port()
        serve = [
            sys.executable, "-m", "marketplace.cli", "serve", "--dev",
            "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "8",
        ]  # fmt: skip
        proc = subprocess.Popen(
            serve,
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120  # migrations first, on a busy machine
            while True:
                assert proc.poll() is None, "gpuflex serve exited"
                try:
                    httpx.get(f"{url}/signup/", timeout=10)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "gpuflex serve never listened"
                    time.sleep(0.3)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


def _burst(count: int, request) -> Counter[int]:
    # as many threads as requests, more than the server's 16: all in flight together
    with ThreadPoolExecutor(count) as pool:
        return Counter(pool.map(request, range(count)))


def test_concurrent_key_guesses_across_workers_pass_no_more_than_the_rate(server: str) -> None:
    def guess(i: int) -> int:
        key = f"gfx_u_{secrets.token_urlsafe(32)}"
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{server}/api/v1/jobs/", headers=headers, timeout=60).status_code

    statuses = _burst(40, guess)
    assert statuses == {401: GUESS_LIMIT, 429: 40 - GUESS_LIMIT}, statuses
    # and the address stays refused, one guess after another
    assert {guess(0) for _ in range(10)} == {429}


def test_concurrent_signups_across_workers_pass_no_more_than_the_rate(server: str) -> None:
    page = httpx.get(f"{server}/signup/", timeout=60)
    token = page.cookies["csrftoken"]
    form_token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert form_token is not None

    def sign_up(i: int) -> int:
        form = {
            "csrfmiddlewaretoken": form_token.group(1),
            "username": f"sock{i}",
            "role": "buyer",
            "password": "correct-horse-battery-9",
        }
        response = httpx.post(
            f"{server}/signup/", data=form, cookies={"csrftoken": token}, timeout=60
        )
        return response.status_code

    statuses = _burst(20, sign_up)
    assert statuses == {302: SIGNUP_LIMIT, 429: 20 - SIGNUP_LIMIT}, statuses
