"""What every lean agent request does first, in one Redis round trip: the lean heartbeat
(api/heartbeat_fast.py) and the lean claim (api/claim_fast.py) each authenticate a node key,
count the request in its throttle's window and mark the node's presence, which through DRF
were three round trips (the key cache's MGET, the throttle's EVALSHA, presence's HSET).

One Lua script does the three by their own rules:

1. the key's cache entry and bypass mark, read as `key_cache.lookup` reads them: a mark, no
   entry, an entry that does not parse or a key that is not a node's means "not here";
2. the throttle's sliding window for that key, under the same key as the DRF throttle
   (`KeyRateThrottle.key_base` and the key's id; rate_counts' `take`, the same Lua);
3. presence's HSET of the caller's mark (a beat, or a "seen" time) under the key's node.

"Not here" counts and writes nothing, and a request over its rate has its count taken back,
so in both cases the caller hands the request to the DRF view, whose own steps then answer
it as they always did (a 401 from the database, the throttle's 429 with its Retry-After). The
script forms the throttle's key from the cached key's id inside Redis, a key it was not
passed: fine on one Redis server (what shared_redis connects to), not on a Redis Cluster.
"""

from __future__ import annotations

import redis
from django.http import HttpRequest

from marketplace.accounts import key_cache, keys
from marketplace.api import rate_counts
from marketplace.api.throttles import KeyRateThrottle
from marketplace.nodes import presence
from marketplace.server import redis_lane

# KEYS: the key cache's entry and bypass mark, the presence hash to mark. ARGV: the
# throttle's key up to the key's id, the current and previous windows' indexes, the count's
# ttl, the rate's limit (-1: no rate), into, the mark. Answers {1, node id} (counted and
# marked), {2} (over the rate: nothing marked, the count taken back) or {0} (not here:
# nothing counted or written).
_SCRIPT = (
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
return {1, entry.node}
"""
)

MARKED = 1  # the script's answer when it counted and marked (2: over the rate; 0: not here)

# what a lean answer serves: a JSON Accept, or none (anything else is DRF's negotiation)
_JSON_ACCEPTS = frozenset({"", "*/*", "application/json"})
# DRF's headers on every answer of a POST-only APIView (APIView.default_response_headers)
VIEW_HEADERS = {"Vary": "Accept", "Allow": "POST, OPTIONS"}


def _client() -> redis.Redis | None:
    """The Redis that holds both the key cache and presence, None where they are not one
    server (no Redis: the embedded setup; either turned off): no lean path then."""
    r = key_cache.redis_client()
    return r if r is not None and presence.redis_client() is r else None


def plain_caller(request: HttpRequest) -> tuple[redis.Redis, str] | None:
    """(the Redis to ask, the node key) for a POST that a lean answer may serve: JSON or no
    Accept, a node key, and Redis holding both the key cache and presence; else None."""
    if request.method != "POST" or request.META.get("HTTP_ACCEPT", "") not in _JSON_ACCEPTS:
        return None
    r = _client()
    if r is None:
        return None
    token = node_token(request.META.get("HTTP_AUTHORIZATION", ""))
    return None if token is None else (r, token)


def node_token(authorization: str) -> str | None:
    """The node key of an `Authorization: Bearer gfx_n_…` header, as ApiKeyAuthentication
    reads it; None for anything else."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(keys.NODE_PREFIX):
        return None
    return token


def mark(
    client: redis.Redis, token: str, throttle: KeyRateThrottle, presence_hash: str, value: str
) -> int | None:
    """The key's node, once the request is counted in `throttle`'s window and `value` is
    written under the node in `presence_hash`; None when the key is not in the cache or the
    request is over its rate (nothing counted or written: the DRF view's to answer).
    redis.RedisError when Redis fails."""
    limit, index, into = -1, 0, 0.0
    if throttle.rate is not None:
        limit = throttle.num_requests
        index, into = throttle.window()
    entry, bypass = key_cache.redis_keys(keys.digest(token))
    answer = redis_lane.run_script(
        client, rate_counts.script(client, _SCRIPT),
        keys=[entry, bypass, presence_hash],
        args=[
            rate_counts.redis_key(throttle.key_base()), index, index - 1,
            rate_counts.ttl_arg(2 * (throttle.duration or 0)), limit, repr(into), value,
        ],
    )  # fmt: skip
    if answer[0] != MARKED:
        return None
    return int(answer[1])
