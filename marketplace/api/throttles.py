"""Rate limits; 429 carries Retry-After. Rates are REST_FRAMEWORK's DEFAULT_THROTTLE_RATES
(settings, GPUFLEX_THROTTLE_*), counted in the default cache."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from marketplace.accounts.client_ip import client_ip


class KeyRateThrottle(SimpleRateThrottle):
    """Every request, per API key (node keys and user keys alike)."""

    scope = "key"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        key = request.auth
        ident = f"k{key.pk}" if key is not None else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def get_ident(self, request: Request) -> str:
        return client_ip(request)


class HeartbeatThrottle(KeyRateThrottle):
    scope = "heartbeat"


class ProbeThrottle(KeyRateThrottle):
    scope = "probe"  # an agent probes its link as it starts, not as it works


class UserPostThrottle(SimpleRateThrottle):
    """POSTs per user, whichever of their keys they use (more keys buy no more)."""

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.method != "POST" or request.user is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"u{request.user.pk}"}


class SubmitThrottle(UserPostThrottle):
    scope = "submit"


class KeyCreateThrottle(UserPostThrottle):
    scope = "key_create"


class AddressThrottle(SimpleRateThrottle):
    """Counted per client address, by the caller: `refuse_if_over` before the work and
    `record` after each counted event (a failure, a sign-up), so only those use the rate."""

    def get_cache_key(self, request: HttpRequest, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": client_ip(request)}

    def _load(self, request: HttpRequest) -> None:
        self.key = self.get_cache_key(request, None)
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()

    def retry_after(self, request: HttpRequest) -> float | None:
        """Seconds until this address may try again, or None if it may now."""
        if self.rate is None:
            return None
        self._load(request)
        return self.wait() if len(self.history) >= self.num_requests else None

    def refuse_if_over(self, request: HttpRequest) -> None:
        wait = self.retry_after(request)
        if wait is not None:
            raise exceptions.Throttled(wait)

    def record(self, request: HttpRequest) -> None:
        if self.rate is not None:
            self._load(request)
            self.throttle_success()


class AuthFailureThrottle(AddressThrottle):
    """Unknown or revoked API keys per address: over the rate, the address is refused (429)
    before any key of its is looked up, so guessing keys costs the server nothing more."""

    scope = "auth_failure"


class SignupThrottle(AddressThrottle):
    scope = "signup"
