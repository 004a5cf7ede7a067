"""Rate limits per API key (node keys and user keys alike); 429 carries Retry-After."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle


class KeyRateThrottle(SimpleRateThrottle):
    scope = "key"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        key = request.auth
        ident = f"k{key.pk}" if key is not None else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class HeartbeatThrottle(KeyRateThrottle):
    scope = "heartbeat"


class ProbeThrottle(KeyRateThrottle):
    scope = "probe"  # an agent probes its link as it starts, not as it works
