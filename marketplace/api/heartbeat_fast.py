"""The lean heartbeat: `POST agent/heartbeat` answered ahead of most of Django's middleware
and without DRF's dispatch, in one Redis round trip, where it can be (issue 36, fourth pass;
docs/scale.md).

A heartbeat through DRF made three Redis round trips (the key cache's MGET, the throttle's
EVALSHA, presence's HSET) and went through DRF's content negotiation, parser, authentication,
permission and throttle classes, serializers and renderer: together most of its CPU. Here, for
the request every agent sends (a node key, a JSON body of the plain shape heartbeat_body.py
accepts), one Lua script does all three steps in Redis by their own rules:

1. the key's cache entry and bypass mark, read as `key_cache.lookup` reads them: a mark, no
   entry, an entry that does not parse or a key that is not a node's means "not here";
2. the heartbeat throttle's sliding window for that key, counted under the same key as
   `HeartbeatThrottle` (rate_counts' `take`, the same Lua);
3. presence's HSET of the beat under the key's node (what `presence.record` writes).

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

`LeanHeartbeatMiddleware` sits after the request id, metrics and operations middleware (so a
lean heartbeat has its X-Request-ID, its log context and its `/metrics` counts) and runs the
middleware after it that acts on such a request (HTTPS redirect, allowed hosts, security and
frame headers) around the answer; it skips those that do nothing for it, and URL
resolution. The script computes the throttle's key from the cached key's
id inside Redis, a key it was not passed: fine on one Redis server (what shared_redis
connects to), not on a Redis Cluster.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, resolve, reverse
from django.utils import timezone
from django.utils.module_loading import import_string
from rest_framework import serializers
from rest_framework.utils.json import strict_constant

from marketplace.accounts import key_cache, keys
from marketplace.api import rate_counts
from marketplace.api.heartbeat_body import plain_body
from marketplace.api.throttles import HeartbeatThrottle
from marketplace.nodes import presence
from marketplace.nodes.services import heartbeat_beat, heartbeat_reply
from marketplace.observability import metrics as obs
from trainer.nesting import MAX_DEPTH, loads_json

log = logging.getLogger(__name__)

# KEYS: the key cache's entry and bypass mark, presence's hash of beats. ARGV: the
# throttle's key up to the key's id, the current and previous windows' indexes, the count's
# ttl, the rate's limit (-1: no rate), into, the beat. Answers {1} (recorded), {2} (over the
# rate: nothing recorded, the count taken back) or {0} (not here: nothing counted or written).
_HEARTBEAT = (
    rate_counts.TAKE_FUNCTION
    + """
if redis.call('EXISTS', KEYS[2]) == 1 then return {0} end
local raw = redis.call('GET', KEYS[1])
if not raw then return {0} end
local ok, entry = pcall(cjson.decode, raw)
if not ok or type(entry) ~= 'table' or type(entry.id) ~= 'number'
    or type(entry.user) ~= 'number' or type(entry.node) ~= 'number' then
  return {0}
end
if tonumber(ARGV[5]) >= 0 then
  local base = ARGV[1] .. string.format('%d', entry.id) .. ':'
  local taken = take(base .. ARGV[2], base .. ARGV[3], ARGV[4], ARGV[5], ARGV[6])
  if taken[1] == 0 then return {2} end
end
redis.call('HSET', KEYS[3], string.format('%d', entry.node), ARGV[7])
return {1}
"""
)

RECORDED, THROTTLED = 1, 2

# a heartbeat is a few hundred bytes; anything far larger is the serializer's to refuse
_MAX_BODY = 64 * 1024
_JSON_ACCEPTS = frozenset({"", "*/*", "application/json"})
# DRF's answer to any request of this view (APIView.default_response_headers)
_HEADERS = {"Vary": "Accept", "Allow": "POST, OPTIONS"}
_TIME = serializers.DateTimeField()  # the reply's format, as HeartbeatReplySerializer's


def _node_token(request: HttpRequest) -> str | None:
    """The node key of `Authorization: Bearer gfx_n_…`, as ApiKeyAuthentication reads it."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(keys.NODE_PREFIX):
        return None
    return token


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
    if request.method != "POST" or request.META.get("HTTP_ACCEPT", "") not in _JSON_ACCEPTS:
        return None
    r = key_cache.redis_client()
    if r is None or presence.redis_client() is not r:
        return None
    token = _node_token(request)
    if token is None:
        return None
    body = plain_body(_json_body(request))
    if body is None:
        return None
    throttle = HeartbeatThrottle()
    limit, index, into = -1, 0, 0.0
    if throttle.rate is not None:
        limit = throttle.num_requests
        index, into = throttle.window()
    now = timezone.now()
    beat = heartbeat_beat(0, now, **body)  # its node is the cached key's: the script's
    entry, bypass = key_cache.redis_keys(keys.digest(token))
    try:
        (outcome,) = rate_counts.script(r, _HEARTBEAT)(
            keys=[entry, bypass, presence.beats_key()],
            args=[
                rate_counts.redis_key(throttle.key_base()), index, index - 1,
                rate_counts.ttl_arg(2 * (throttle.duration or 0)), limit, repr(into),
                presence.encode(beat),
            ],
        )  # fmt: skip
    except redis.RedisError as exc:  # the DRF view's steps each fall back on their own
        log.debug("lean heartbeat: Redis failed (%s); the full path answers", exc)
        return None
    if outcome != RECORDED:
        return None
    obs.heartbeat(body["state"])
    response = HttpResponse(reply_bytes(heartbeat_reply(now)), content_type="application/json")
    for name, value in _HEADERS.items():
        response[name] = value
    return response


# What a lean heartbeat skips of the middleware after LeanHeartbeatMiddleware, each because it
# does nothing for this request: no session is read, the view is CSRF-exempt (DRF's), the user
# is never asked for, no message is stored, axes acts on logins only.
_NOTHING_FOR_A_HEARTBEAT = frozenset(
    {
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "axes.middleware.AxesMiddleware",
    }
)
# ...and what it runs, as the chain would: HTTPS redirect, allowed hosts, refused user agents
# (process_request), the security and frame headers, Content-Length (process_response)
_SITE_RULES = frozenset({
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
})  # fmt: skip


class LeanHeartbeatMiddleware:
    """Answers a plain heartbeat (`answer`) ahead of the middleware and URL resolution it does
    not need: under gunicorn those layers were about a third of a heartbeat's CPU (docs/
    scale.md, fourth pass). The site's rules still apply: the middleware after this one that
    acts on such a request (_SITE_RULES) runs around the answer as the chain would run it;
    any request they would stop or redirect, and everything `answer` leaves, goes down the
    whole chain to the DRF view. A middleware after this one that is in neither list (an
    operator's own) turns the lean path off, rather than being skipped."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        after = settings.MIDDLEWARE[settings.MIDDLEWARE.index(_THIS) + 1 :]
        unknown = [m for m in after if m not in _NOTHING_FOR_A_HEARTBEAT | _SITE_RULES]
        self.enabled = not unknown
        if unknown:
            log.info("lean heartbeat off: the middleware %s may act on heartbeats", unknown)
        # instances of the real classes, for their process_request/process_response only
        rules = [import_string(m)(get_response) for m in after if m in _SITE_RULES]
        self.on_request = [r.process_request for r in rules if hasattr(r, "process_request")]
        # innermost first, as a response passes the chain
        self.on_response = [r.process_response for r in reversed(rules)]
        self.path: str | None = None
        self.route = ""

    def _heartbeat_path(self) -> str:
        if self.path is None:  # the URLconf's, once: its path and the route metrics label
            try:
                path = reverse(HEARTBEAT_URL)
                self.route = "/" + resolve(path).route
            except NoReverseMatch:  # a URLconf without the agent API: nothing to answer
                self.enabled = False
                path = ""
            self.path = path
        return self.path

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not self.enabled or request.path_info != self._heartbeat_path():
            return self.get_response(request)
        try:
            if any(check(request) is not None for check in self.on_request):
                return self.get_response(request)  # a redirect: the chain gives it
            fast = answer(request)
        except (SuspiciousOperation, PermissionDenied):  # a refused host or user agent
            return self.get_response(request)  # the chain's answer and its log line
        except Exception:
            log.exception("lean heartbeat failed; the full path answers")
            fast = None
        if fast is None:
            return self.get_response(request)
        request.metrics_route = self.route  # type: ignore[attr-defined]
        for finish in self.on_response:
            fast = finish(request, fast)
        return fast


_THIS = f"{LeanHeartbeatMiddleware.__module__}.{LeanHeartbeatMiddleware.__qualname__}"
HEARTBEAT_URL = "agent-heartbeat"
