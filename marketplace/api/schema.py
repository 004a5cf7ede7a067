"""drf-spectacular extensions: the bearer API keys, and the error answers of every operation.

drf-spectacular documents only the success answers, so clients and schemathesis saw most 4xx
as undocumented. AutoSchema adds, to each operation, the errors the API's machinery gives it
(parsing, authentication, permissions, lookups, throttles); views add the domain errors their
services raise (409, 402, 413, 422) in their extend_schema with `errors(...)`.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.accounts.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "gfx_u_… (users) or gfx_n_… (nodes) API key",
        }


class ErrorSerializer(serializers.Serializer):
    """marketplace.api.errors' envelope; some errors add fields (`fields` on a 400 naming each
    invalid field, `request_id` on a 500)."""

    error = serializers.CharField(help_text="a stable code, e.g. invalid, not_found, conflict")
    detail = serializers.CharField(help_text="a sentence that names the problem")

    class Meta:
        ref_name = "Error"


DESCRIPTIONS = {
    400: "The request is invalid: the detail names the field or parameter.",
    401: "No valid API key was given.",
    402: "The account's balance does not cover it.",
    403: "This key may not do this (a user key where a node key belongs, or the wrong role).",
    404: "No such object exists or it is not yours.",
    409: "The object's state does not allow it now.",
    413: "The body is larger than the limit the detail names.",
    415: "The body's Content-Type is not one this operation takes.",
    422: "The upload was read but rejected; the detail says why.",
    429: "Too many requests; retry after the Retry-After header's seconds.",
    503: "The server holds all the live streams it may; poll, or retry after Retry-After.",
}


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Responses for extend_schema(responses={...}) of the domain errors a view can give."""
    return {
        code: OpenApiResponse(ErrorSerializer, description=DESCRIPTIONS[code]) for code in codes
    }


class AutoSchema(openapi.AutoSchema):
    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        ref = self.resolve_serializer(ErrorSerializer, "response").ref
        responses = operation["responses"]
        for code in self._machinery_errors(operation):
            responses.setdefault(
                str(code),
                {
                    "description": DESCRIPTIONS[code],
                    "content": {"application/json": {"schema": ref}},
                },
            )
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _machinery_errors(self, operation: dict[str, Any]) -> list[int]:
        params = operation.get("parameters", [])
        codes = [401]  # a wrong key fails authentication even where none is needed
        if self.method in ("POST", "PUT", "PATCH") or any(p["in"] != "path" for p in params):
            codes.append(400)  # a body that does not parse, or a bad query parameter / header
        if not all(isinstance(p, AllowAny) for p in self.view.get_permissions()):
            codes.append(403)
        if any(p["in"] == "path" for p in params):
            codes.append(404)
        if "requestBody" in operation:
            codes.append(415)
        if self.view.get_throttles():
            codes.append(429)
        return codes
