"""The lean heartbeat: `POST agent/heartbeat` answered ahead of most of Django's middleware
and without DRF's dispatch, in one Redis round trip, where it can be (issue 36, fourth pass;
docs/scale.md).

A heartbeat through DRF made three Redis round trips (the key cache's MGET, the throttle's
EVALSHA, presence's HSET) and went through DRF's content negotiation, parser, authentication,
permission and throttle classes, serializers and renderer: together most of its CPU. Here, for
the request every agent sends (a node key, a JSON body of the plain shape heartbeat_body.py
accepts), the key, the heartbeat throttle's window and presence's beat are one Redis round
trip (api/lean_key.py), and the reply is written as DRF writes it.

Everything else goes down the whole middleware chain to the DRF view, unchanged, before
anything was counted or written: a request without a node key in the cache (its first in
GPUFLEX_KEY_CACHE_S, a revoked key, whose bypass mark sends it to the database: a 401), a body
of any other shape (the serializer answers, with its 400 naming the field), a runtime, an
Accept header asking for something but JSON, no Redis (the embedded SQLite setup), Redis
unreachable. A heartbeat over its rate has its count taken back in the script, as the
throttle does, and is then handed to the DRF view too, whose throttle answers the 429 with
its Retry-After (the window is counted again there: a refused request costs what it cost
before). So every answer but the plain 200 comes from the code that gave it before, and the
200 is byte for byte the DRF view's (tests/marketplace/test_heartbeat_fast.py).
`api/lean_path.py` answers it ahead of the middleware it does not need.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from rest_framework import serializers
from rest_framework.utils.json import strict_constant

from marketplace.api import lean_key
from marketplace.api.heartbeat_body import plain_body
from marketplace.api.throttles import HeartbeatThrottle
from marketplace.nodes import presence
from marketplace.nodes.services import heartbeat_beat, heartbeat_reply
from marketplace.observability import metrics as obs
from trainer.nesting import MAX_DEPTH, loads_json

log = logging.getLogger(__name__)


# a heartbeat is a few hundred bytes; anything far larger is the serializer's to refuse
_MAX_BODY = 64 * 1024
_TIME = serializers.DateTimeField()  # the reply's format, as HeartbeatReplySerializer's


def _json_body(request: HttpRequest) -> Any:
    """The body as DepthLimitedJSONParser reads it, or None for anything else."""
    content_type = request.META.get("CONTENT_TYPE", "")
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "application/json" or params.strip() not in (
        "", "charset=utf-8", "charset=UTF-8",
    ):  # fmt: skip
        return None
    try:
        if int(request.META.get("CONTENT_LENGTH") or 0) > _MAX_BODY:
            return None
        text = request.body.decode("utf-8")
        return loads_json(text, MAX_DEPTH, parse_constant=strict_constant)
    except (ValueError, UnicodeError):  # JSONDecodeError, TooDeep, a bad length: DRF's 400
        return None


def reply_bytes(reply: dict[str, Any]) -> bytes:
    """HeartbeatReplySerializer(reply).data as DRF's JSONRenderer writes it."""
    data = {
        "server_time": _TIME.to_representation(reply["server_time"]),
        "heartbeat_interval_s": float(reply["heartbeat_interval_s"]),
        "lease_timeout_s": float(reply["lease_timeout_s"]),
    }
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def answer(request: HttpRequest) -> HttpResponse | None:
    """The 200 for a plain heartbeat recorded in one round trip, or None: the DRF view's to
    answer (nothing was counted or written, or the heartbeat was over its rate)."""
    try:
        return _answer(request)
    except Exception:  # at worst the beat was recorded, and the view records it again
        log.exception("lean heartbeat failed; the full path answers")
        return None


def _answer(request: HttpRequest) -> HttpResponse | None:
    caller = lean_key.plain_caller(request)
    if caller is None:
        return None
    r, token = caller
    body = plain_body(_json_body(request))
    if body is None:
        return None
    now = timezone.now()
    beat = heartbeat_beat(0, now, **body)  # its node is the cached key's: the script's
    try:
        node = lean_key.mark(
            r, token, HeartbeatThrottle(), presence.beats_key(), presence.encode(beat)
        )
    except redis.RedisError as exc:  # the DRF view's steps each fall back on their own
        log.debug("lean heartbeat: Redis failed (%s); the full path answers", exc)
        return None
    if node is None:
        return None
    obs.heartbeat(body["state"])
    response = HttpResponse(reply_bytes(heartbeat_reply(now)), content_type="application/json")
    for name, value in lean_key.VIEW_HEADERS.items():
        response[name] = value
    return response
