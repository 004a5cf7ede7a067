"""/api/v1/schema/: the OpenAPI document, generated once per process and then served as is.

drf-spectacular generates the schema on every request. That costs a second or more of CPU,
and two first requests racing on a fresh worker thread pool fail: its extensions resolve
their target classes lazily, in place, with no lock, and the loser of the race reads a
target that the winner already set to None (`AttributeError: 'NoneType' object has no
attribute 'startswith'`, tfranzel/drf-spectacular#1122). The document depends only on the
code, the settings and the API version and language asked for, so it is generated once for
each of those under a lock and every later request (or racing one) serves that copy.
"""

from __future__ import annotations

import threading
from typing import Any

from django.utils import translation
from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

_lock = threading.Lock()
_schemas: dict[tuple[str | None, str | None], dict[str, Any]] = {}


def clear_cache() -> None:
    """Forget the generated documents (tests that change what the schema describes)."""
    with _lock:
        _schemas.clear()


class CachedSchemaView(SpectacularAPIView):
    def _get_schema_response(self, request: Request) -> Response:
        version = self.api_version or request.version or self._get_version_parameter(request)
        key = (version, translation.get_language())
        with _lock:  # held while generating: a racing request waits for the one document
            schema = _schemas.get(key)
            if schema is None:
                generator = self.generator_class(
                    urlconf=self.urlconf, api_version=version, patterns=self.patterns
                )
                schema = generator.get_schema(request=request, public=self.serve_public)
                _schemas[key] = schema
        return Response(
            data=schema,
            headers={
                "Content-Disposition": f'inline; filename="{self._get_filename(request, version)}"'
            },
        )
