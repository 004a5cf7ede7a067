"""/healthz, /readyz and /metrics: plain Django views (no DRF authentication or throttles,
no session, no torch), served by OperationsMiddleware before the rest of the stack."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST

from marketplace.observability import checks, exposition
from marketplace.observability.access import metrics_refusal


def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up and answering; touches nothing else (a liveness probe)."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> HttpResponse:
    """The dependencies answer: 200, or 503 naming each that failed (a readiness probe)."""
    states = checks.run()
    failed = [name for name, state in states.items() if state != "ok"]
    body = {"status": "unavailable" if failed else "ok", "checks": states, "failed": failed}
    return JsonResponse(body, status=503 if failed else 200)


def metrics(request: HttpRequest) -> HttpResponse:
    if refusal := metrics_refusal(request):
        return JsonResponse({"detail": refusal}, status=403)
    return HttpResponse(exposition.render(), content_type=CONTENT_TYPE_LATEST)
