"""Who may read /metrics: with GPUFLEX_METRICS_TOKEN set, whoever sends it as a bearer
token; without it, only a scraper on this host talking to the server directly (a loopback
address and no proxy's forwarding headers: nginx in front forwards from loopback too)."""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest

_FORWARDED = ("HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED")


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def metrics_refusal(request: HttpRequest) -> str:
    """Why this request may not read /metrics ("" when it may)."""
    token = getattr(settings, "GPUFLEX_METRICS_TOKEN", "")
    if token:
        given = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token):
            return ""
        return "send GPUFLEX_METRICS_TOKEN as 'Authorization: Bearer <token>'"
    if _loopback(request.META.get("REMOTE_ADDR", "")) and not any(
        h in request.META for h in _FORWARDED
    ):
        return ""
    return (
        "/metrics answers only on loopback without a proxy in between; set "
        "GPUFLEX_METRICS_TOKEN to scrape it from elsewhere"
    )
