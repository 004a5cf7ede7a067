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
            failures.refuse_if_over(request)  # a failure counted, or 429 with Retry-After
            raise exceptions.AuthenticationFailed(
                "The Authorization header must be 'Bearer <api key>'."
            )
        # Every key looked up in the database is counted as a failure before the lookup (an
        # address over its rate is refused then, its key unread), and given back if it was
        # valid: counted afterwards, a burst of concurrent guesses all passed the check. A
        # key found in the cache (never a guessed one) skips all this.
        looked_up = False

        def before_database() -> None:
            nonlocal looked_up
            failures.refuse_if_over(request)
            looked_up = True

        key = active_key(token.strip(), before_database=before_database)
        if key is None:
            if not looked_up:
                failures.refuse_if_over(request)
            raise exceptions.AuthenticationFailed("The API key is unknown or has been revoked.")
        if looked_up:
            failures.release(request)
        if not ApiKey.user.is_cached(key):
            # a cached key (key_cache.py): its user is read only if the view asks for it, so
            # a heartbeat authenticates without the database
            return SimpleLazyObject(lambda: key.user), key
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
