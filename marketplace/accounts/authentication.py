"""DRF authentication by `Authorization: Bearer gfx_…` keys."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from marketplace.accounts.models import ApiKey, User
from marketplace.accounts.selectors import active_key
from marketplace.api.throttles import AuthFailureThrottle


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        failures = AuthFailureThrottle()
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not token.strip():
            failures.refuse_if_over(request)  # 429 with Retry-After
            failures.record(request)
            raise exceptions.AuthenticationFailed(
                "The Authorization header must be 'Bearer <api key>'."
            )
        # an address over its failure rate is refused before its key is looked up in the
        # database; a key found in the cache (never a guessed one) skips that check
        key = active_key(token.strip(), before_database=lambda: failures.refuse_if_over(request))
        if key is None:
            failures.record(request)
            raise exceptions.AuthenticationFailed("The API key is unknown or has been revoked.")
        if not ApiKey.user.is_cached(key):
            # a cached key (key_cache.py): its user is read only if the view asks for it, so
            # a heartbeat authenticates without the database
            return SimpleLazyObject(lambda: key.user), key
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
