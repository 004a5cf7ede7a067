"""Rate limits; 429 carries Retry-After. Rates are REST_FRAMEWORK's DEFAULT_THROTTLE_RATES
(settings, GPUFLEX_THROTTLE_*), counted in shared atomic counters (rate_counts.py: Redis, or a
file in the data folder), so they hold under concurrent requests and across every worker.

Each rate N/period is a sliding window: the count of the current fixed window plus the
previous window's, weighted by how much of it still lies within one period. A request is
one atomic increment, and it passes only if the count it got back is within the rate, so no
burst of concurrent requests passes more than N; a refused request takes its count back, so
a client that keeps hammering is not refused for longer than the rate says.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from typing import Any

import redis
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from marketplace.accounts.client_ip import client_ip
from marketplace.api import rate_counts

log = logging.getLogger(__name__)

# the counters' store unreachable: let the request through (and say so) rather than fail it
_STORE_ERRORS = (redis.RedisError, sqlite3.Error)


class WindowThrottle(SimpleRateThrottle):
    """DRF's rate parsing and cache keys, counted in rate_counts' atomic counters."""

    def window(self) -> tuple[int, float]:
        """The current window's index and how far into it it is (0 to 1)."""
        position = self.timer() / self.duration
        index = math.floor(position)
        return index, position - index

    def _windows(self, base: str) -> tuple[str, str, float]:
        """The current and previous windows' keys and how far into the current one it is
        (0 to 1)."""
        index, into = self.window()
        return f"{base}:{index}", f"{base}:{index - 1}", into

    def _seconds_until_one_more(self, count: int, previous: int, into: float) -> float:
        """How long until one more request fits: within this window once enough of the
        previous one has slid out, else in the next one (this window's count is then the
        previous)."""
        room = self.num_requests - count - 1  # what the previous window may still weigh
        if room >= 0:
            slide = 1 - room / previous if previous else 0.0  # `into` at which it fits
            wait = (slide - into) * self.duration
        else:
            following = 1 - (self.num_requests - 1) / count if count else 0.0
            wait = (1 - into + max(0.0, following)) * self.duration
        return max(1.0, math.ceil(round(wait, 6)))  # whole seconds, up (not for float noise)

    def take(self, key: str) -> float | None:
        """Count one request under `key`: None if it is within the rate, else the seconds
        until one more would be (the count is then taken back)."""
        current, previous_key, into = self._windows(key)
        try:  # one round trip with Redis (rate_counts' script)
            allowed, count, previous = rate_counts.store().take(
                current, previous_key, 2 * self.duration, self.num_requests, into
            )
            if allowed:
                return None
        except _STORE_ERRORS:
            log.warning("rate counters unavailable; %s not limited", key, exc_info=True)
            return None
        return self._seconds_until_one_more(count, previous, into)

    def give_back(self, key: str) -> None:
        """Take back a count `take` made: the event it was for turned out not to count."""
        current, _, _ = self._windows(key)
        try:
            rate_counts.store().add(current, -1, 2 * self.duration)
        except _STORE_ERRORS:
            log.warning("rate counters unavailable; %s not given back", key, exc_info=True)

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        self._wait = self.take(key)
        return self._wait is None

    def wait(self) -> float | None:
        return getattr(self, "_wait", None)


class KeyRateThrottle(WindowThrottle):
    """Every request, per API key (node keys and user keys alike)."""

    scope = "key"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        key = request.auth
        if key is not None:
            return self.key_base() + str(key.pk)
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def key_base(self) -> str:
        """An API key's counts are under this and the key's id (the lean heartbeat's script
        in heartbeat_fast.py counts under the same)."""
        return self.cache_format % {"scope": self.scope, "ident": "k"}

    def get_ident(self, request: Request) -> str:
        return client_ip(request)


class HeartbeatThrottle(KeyRateThrottle):
    scope = "heartbeat"


class ProbeThrottle(KeyRateThrottle):
    scope = "probe"  # an agent probes its link as it starts, not as it works


class UserPostThrottle(WindowThrottle):
    """POSTs per user, whichever of their keys they use (more keys buy no more)."""

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.method != "POST" or request.user is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"u{request.user.pk}"}


class SubmitThrottle(UserPostThrottle):
    scope = "submit"


class KeyCreateThrottle(UserPostThrottle):
    scope = "key_create"


class AddressThrottle(WindowThrottle):
    """Events per client address (a failure, a sign-up), counted by the caller: `reserve`
    before the work, which takes a count or refuses, and `release` after it if the event
    turned out not to count (a key that was valid, a form with errors). Reserving first is
    what holds the rate under concurrency: checking first and counting afterwards let every
    request of a burst through the check before any of them was counted."""

    def get_cache_key(self, request: HttpRequest, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": client_ip(request)}

    def reserve(self, request: HttpRequest) -> float | None:
        """Count one event for this address: None if it may go ahead, else the seconds
        until it may try again (nothing is then counted)."""
        if self.rate is None:
            return None
        return self.take(self.get_cache_key(request, None))

    def refuse_if_over(self, request: HttpRequest) -> None:
        """`reserve`, raising 429 (with Retry-After) if the address is over its rate."""
        wait = self.reserve(request)
        if wait is not None:
            raise exceptions.Throttled(wait)

    def release(self, request: HttpRequest) -> None:
        if self.rate is not None:
            self.give_back(self.get_cache_key(request, None))


class AuthFailureThrottle(AddressThrottle):
    """Unknown or revoked API keys per address: over the rate, the address is refused (429)
    before any key of its is looked up, so guessing keys costs the server nothing more."""

    scope = "auth_failure"


class SignupThrottle(AddressThrottle):
    scope = "signup"
