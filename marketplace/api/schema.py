"""drf-spectacular extensions: describe the bearer API keys in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.accounts.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "gfx_u_… (users) or gfx_n_… (nodes) API key",
        }
