"""The client's address as the server may believe it (throttles and the login lockout)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str:
    """REMOTE_ADDR, or with TRUSTED_PROXIES = n reverse proxies in front (GPUFLEX_TRUSTED_PROXIES),
    the X-Forwarded-For entry the outermost trusted proxy added. Entries to the left of it
    are whatever the client wrote, so they are never used: DRF's NUM_PROXIES rule."""
    remote = request.META.get("REMOTE_ADDR", "") or ""
    proxies = int(getattr(settings, "TRUSTED_PROXIES", 0) or 0)
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if proxies <= 0 or not forwarded:
        return remote
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    return hops[-min(proxies, len(hops))] if hops else remote
