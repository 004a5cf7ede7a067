"""The lean claim: `POST agent/claim` answered without DRF's dispatch and ahead of most of
Django's middleware (api/lean_path.py), where it can be (issue 36, eighth pass; docs/scale.md).

Through DRF a claim made three Redis round trips before its first statement (the key cache's
MGET, the key throttle's EVALSHA, presence's "seen" HSET) and went through content
negotiation, authentication, permission and throttle classes, the query's serializer and the
renderer's negotiation: about a quarter of a claim's CPU (docs/scale.md's profiles). Here, for
the claim every agent sends (a node key, `max` and `wait` written plainly, an Idempotency-Key
or none), the key, the throttle's window and the node's "seen" mark are one round trip
(api/lean_key.py), and the claim itself is the view's own code (`claimed`).

Everything else goes down the whole chain to the DRF view before anything was counted or
written: a key not in the cache (a revoked key's bypass mark included: a 401 from the
database), a user key (403), a query or Idempotency-Key the plain check does not take (the
serializer's 400, naming what is wrong), an Accept other than JSON, no Redis (the embedded
SQLite setup), Redis unreachable, a claim over the key's rate (counted back; the view's
throttle answers the 429). Once the claim has begun, nothing falls through: a second claim
would lease again, so an error there is the server's 500, as the view's would be.
The answers are the view's byte for byte (tests/marketplace/test_claim_fast.py).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse, QueryDict
from django.utils import timezone

from marketplace.api import claim_render, lean_key
from marketplace.api.serializers.agent import CLAIM_KEY, claim_reply
from marketplace.api.throttles import KeyRateThrottle
from marketplace.nodes import presence
from marketplace.rounds.lifecycle import close_after_far_leases
from marketplace.rounds.scheduling import MAX_CLAIM_BATCH, claim_with_wait, task_payloads

log = logging.getLogger(__name__)

# what the plain check takes of the query: a count 1-8 and a wait of whole seconds with up to
# three decimals (the agent's), each once; anything else is the serializer's to judge
_MAX = re.compile(r"[1-9][0-9]?")
_WAIT = re.compile(r"[0-9]{1,2}(\.[0-9]{1,3})?")


def claimed(node_id: int, wait: float, count: int, key: str | None) -> dict[str, Any] | None:
    """A claim of up to `count` tasks for the node, long-polled up to `wait` seconds (at most
    GPUFLEX_MAX_CLAIM_WAIT_S): the reply's data, None when no work came (a 204). The one body
    of a claim, the DRF view's and the lean path's."""
    wait = min(wait, settings.GPUFLEX["MAX_CLAIM_WAIT_S"])
    tasks = claim_with_wait(node_id, wait, count, key)
    if not tasks:
        return None
    close_after_far_leases(tasks)
    payloads = [with_zone(p, t) for p, t in zip(task_payloads(tasks), tasks, strict=True)]
    return claim_reply({"task": payloads[0], "tasks": payloads})


def with_zone(payload: dict, task: object) -> dict:
    """A zones job's task names the aggregator its update goes to (rounds.zones)."""
    from marketplace.rounds.zone_routes import zone_route

    route = zone_route(task)
    return payload | {"zone": route} if route else payload


def plain_query(query: QueryDict) -> tuple[float, int] | None:
    """(wait, max) of a query that ClaimQuerySerializer takes as written, or None for any
    other (the serializer answers it). The same values as the serializer's for what it takes
    (tests/marketplace/test_claim_fast.py)."""
    wait, count = 0.0, 1
    for name, values in query.lists():
        if len(values) != 1:
            return None
        value = values[0]
        if name == "max" and _MAX.fullmatch(value) and int(value) <= MAX_CLAIM_BATCH:
            count = int(value)
        elif name == "wait" and _WAIT.fullmatch(value) and float(value) <= 30.0:
            wait = float(value)
        else:
            return None
    return wait, count


def reply_response(data: dict[str, Any] | None) -> HttpResponse:
    """The view's Response for `claimed`'s answer, as DRF renders it (each job's spec
    rendered once: api/claim_render.py): the JSON 200, or an empty 204 without a
    Content-Type."""
    if data is None:
        response = HttpResponse(status=204)
        del response["Content-Type"]
    else:
        response = HttpResponse(claim_render.render(data), content_type="application/json")
    for name, value in lean_key.VIEW_HEADERS.items():
        response[name] = value
    return response


def _node(request: HttpRequest) -> tuple[int, float, int, str | None] | None:
    """(node, wait, max, key) once the claim is counted and its node marked seen, or None:
    the DRF view's to answer, nothing counted or written."""
    caller = lean_key.plain_caller(request)
    if caller is None:
        return None
    r, token = caller
    query = plain_query(request.GET)
    if query is None:
        return None
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if key is not None and not CLAIM_KEY.fullmatch(key):
        return None
    try:
        node = lean_key.mark(
            r, token, KeyRateThrottle(), presence.seen_key(), presence.encode_seen(timezone.now())
        )
    except redis.RedisError as exc:  # the DRF view's steps each fall back on their own
        log.debug("lean claim: Redis failed (%s); the full path answers", exc)
        return None
    return None if node is None else (node, *query, key)


def answer(request: HttpRequest) -> HttpResponse | None:
    """The claim's answer (200 or 204), or None: the DRF view's to answer, nothing counted,
    written or leased. An error once the claim has begun is raised (a 500), never handed on."""
    try:
        found = _node(request)
    except Exception:  # before anything was leased: the full path answers (and logs it)
        log.exception("lean claim failed before claiming; the full path answers")
        return None
    if found is None:
        return None
    node, wait, count, key = found
    return reply_response(claimed(node, wait, count, key))
