"""Request metrics, and the operations endpoints answered ahead of the rest of the stack."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

from marketplace.observability import metrics, views

Handler = Callable[[HttpRequest], HttpResponse]

# Answered before SecurityMiddleware and CommonMiddleware: a load balancer's probe or a
# Prometheus scrape names the server by its address, which ALLOWED_HOSTS need not list, and
# speaks plain HTTP inside the network, which SECURE_SSL_REDIRECT would redirect.
ENDPOINTS: dict[str, tuple[str, Handler]] = {
    "/healthz": ("healthz", views.healthz),
    "/readyz": ("readyz", views.readyz),
    "/metrics": ("metrics", views.metrics),
}


class RequestMetricsMiddleware:
    """gpuflex_http_requests{route,method,status} and the request duration, labelled by the
    URL pattern that matched (bounded), never by the raw path (unbounded: ids, probes)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = request.resolver_match
        if match is not None:
            route = "/" + match.route
        else:
            route = getattr(request, "metrics_route", "<unmatched>")
        # a streamed response (the event stream) is counted when its stream starts
        metrics.HTTP_DURATION.labels(route).observe(time.perf_counter() - started)
        method = request.method if request.method in _METHODS else "other"
        metrics.HTTP_REQUESTS.labels(route, method, str(response.status_code)).inc()
        return response


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class OperationsMiddleware:
    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        endpoint = ENDPOINTS.get(request.path_info.rstrip("/") or "/")
        if endpoint is None:
            return self.get_response(request)
        name, view = endpoint
        request.metrics_route = "/" + name  # type: ignore[attr-defined]
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        return view(request)
