"""Every 4xx answer is {"error": code, "detail": "a sentence that names the problem"}."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from marketplace.jobs.errors import MarketplaceError

_CODES = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ParseError: "parse_error",
    exceptions.ValidationError: "invalid",
}


def _sentence(data: Any, prefix: str = "") -> str:
    """Flatten DRF's nested validation errors into one readable sentence."""
    if isinstance(data, dict):
        parts = [
            _sentence(v, f"{prefix}{k}." if k != "non_field_errors" else prefix)
            for k, v in data.items()
        ]
        return "; ".join(p for p in parts if p)
    if isinstance(data, list):
        return "; ".join(_sentence(v, prefix) for v in data)
    text = str(data)
    return f"{prefix.rstrip('.')}: {text}" if prefix else text


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, MarketplaceError):
        body = {"error": exc.code, "detail": exc.detail, **exc.extra}
        return Response(body, status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
    if isinstance(exc, exceptions.ValidationError):
        detail = f"The request is invalid: {_sentence(exc.detail).rstrip('.')}."
        response.data = {"error": code, "detail": detail, "fields": exc.detail}
    else:
        detail = str(getattr(exc, "detail", exc))
        response.data = {"error": code, "detail": detail}
    if response.status_code == status.HTTP_404_NOT_FOUND:
        response.data = {
            "error": "not_found",
            "detail": "No such object exists or it is not yours.",
        }
    return response


def not_found_view(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        {"error": "not_found", "detail": f"There is no endpoint at {request.path}."}, status=404
    )


def server_error_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        {"error": "server_error", "detail": "The server failed; the error was logged."},
        status=500,
    )
