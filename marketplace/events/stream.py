"""Server-Sent Events: a page's state, sent when it opens and again whenever it changes.

Each open stream holds one of the web server's application threads (granian's), so a process
serves at most EVENT_STREAMS_PER_PROCESS of them and answers 503 beyond that: the page and
the SDK then poll instead. A stream ends after EVENT_STREAM_MAX_S (the browser's
EventSource reconnects on its own, after the `retry` the stream gave it) or when `done`
says its subject has ended.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from marketplace.events.doorbell import Listener

CONTENT_TYPE = "text/event-stream"
RETRY_MS = 1000

_slots_lock = threading.Lock()
_open = 0


def _take_slot() -> bool:
    global _open
    with _slots_lock:
        if _open >= settings.GPUFLEX["EVENT_STREAMS_PER_PROCESS"]:
            return False
        _open += 1
        return True


def _free_slot() -> None:
    global _open
    with _slots_lock:
        _open -= 1


def frame(data: Any, event: str = "state", event_id: int | None = None) -> bytes:
    """One SSE message; JSON has no raw newlines, so `data` is a single line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = json.dumps(data, separators=(",", ":"), default=str)
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


def event_stream(
    topics: list[str],
    render: Callable[[], dict[str, Any]],
    done: Callable[[dict[str, Any]], bool] = lambda state: False,
    *,
    min_interval: float = 0.0,
) -> HttpResponse:
    """The response for a stream of `render()` over `topics`: 503 when this process holds
    all the streams it may. A ring after a quiet spell renders at once; rings closer than
    `min_interval` to the last render wait for it and are rendered together (a page whose
    state is costly to build, or a busy job, is not rebuilt for every lease)."""
    if not _take_slot():
        # the API's error envelope (marketplace/api/errors.py), for pages and the SDK alike
        busy = JsonResponse(
            {
                "error": "streams_busy",
                "detail": "This server holds all the live streams it may; poll instead.",
            },
            status=503,
        )
        busy["Retry-After"] = "30"
        return busy
    try:
        listener = Listener(topics)  # subscribed before the first render: no change is missed
    except Exception:
        _free_slot()
        raise
    response = StreamingHttpResponse(
        _Stream(listener, _frames(listener, render, done, min_interval)),
        content_type=CONTENT_TYPE,
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each message on as it comes
    return response


class _Stream:
    """The frames, and a close() that Django calls when the response ends: it frees the slot
    and the subscription even when the client left before the first frame was asked for
    (closing a generator that never started runs no `finally`)."""

    def __init__(self, listener: Listener, frames: Iterator[bytes]) -> None:
        self._listener = listener
        self._frames = frames
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self._frames

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._frames.close()
        self._listener.close()
        _free_slot()


def _frames(
    listener: Listener,
    render: Callable[[], dict[str, Any]],
    done: Callable[[dict[str, Any]], bool],
    min_interval: float,
) -> Iterator[bytes]:
    g = settings.GPUFLEX
    keepalive, lifetime = g["EVENT_KEEPALIVE_S"], g["EVENT_STREAM_MAX_S"]
    ends = time.monotonic() + lifetime
    seq = 0
    yield f"retry: {RETRY_MS}\n\n".encode()
    last = render()
    rendered = time.monotonic()
    yield frame(last, event_id=seq)
    while not done(last):
        left = ends - time.monotonic()
        if left <= 0:
            return
        rung = listener.wait(min(keepalive, left))
        if rung and (hold := rendered + min_interval - time.monotonic()) > 0:
            time.sleep(hold)
        state = render()
        rendered = time.monotonic()
        if state != last:
            seq += 1
            last = state
            yield frame(state, event_id=seq)
        elif not rung:
            yield b": keepalive\n\n"  # finds a client that went away; keeps proxies open
