"""Every 4xx answer is {"error": code, "detail": "a sentence that names the problem"}; a 5xx
is {"error": "server_error", "detail": …, "request_id": …} and its traceback is logged with
that request id."""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from marketplace.jobs.errors import MarketplaceError
from marketplace.server.request_id import current_request_id

logger = logging.getLogger("marketplace.api")

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
        if exc.status >= 500:  # a programming error (ledger.errors.Unbalanced): heard of too
            _log(exc, context)
            set_rollback()
            body["request_id"] = current_request_id()
        return Response(body, status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is None:
        return _server_error(exc, context)
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


def _server_error(exc: Exception, context: dict[str, Any]) -> Response:
    """An unexpected exception: logged with its traceback and request id (Django alone sent
    it only to the admins' mailing list, empty by default), answered as JSON naming the id."""
    _log(exc, context)
    set_rollback()
    return Response(
        _server_error_body(current_request_id()), status=status.HTTP_500_INTERNAL_SERVER_ERROR
    )


def _log(exc: Exception, context: dict[str, Any]) -> None:
    request = context.get("request")
    logger.error(
        "%s in %s %s",
        type(exc).__name__,
        getattr(request, "method", "?"),
        getattr(request, "path", "?"),
        exc_info=exc,
    )


def _server_error_body(request_id: str) -> dict[str, str]:
    return {
        "error": "server_error",
        "detail": f"The server failed; the error was logged with request id {request_id}.",
        "request_id": request_id,
    }


def not_found_view(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        {"error": "not_found", "detail": f"There is no endpoint at {request.path}."}, status=404
    )


def server_error_view(request: HttpRequest) -> JsonResponse:
    """Django's handler500 (errors outside DRF views); django.request logged the traceback."""
    return JsonResponse(
        _server_error_body(getattr(request, "request_id", current_request_id())), status=500
    )
