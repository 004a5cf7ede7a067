"""Serializer fields built once per thread, not deep-copied for every request.

DRF deep-copies a serializer's declared fields each time one is instantiated: for the
heartbeat (three nested serializers, a dozen fields) that was most of the ~14 % of its server
CPU spent validating the body (issue 36's profile). The copy exists so that binding a field
to its serializer never touches the class's declared field. Here each thread keeps one such
copy per serializer class and binds it to the next instance: the same fields, validators and
messages, so every check stays; a thread validates one body at a time, so no two requests
share a bound field at once. The claim's reply (its tasks and their model sources, nine
nested serializers for a claim of eight) is written through them too.
"""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()


class ReusedFields:
    """Mixin for a serializers.Serializer on a hot path (put it first in the bases)."""

    @property
    def fields(self) -> Any:
        kept: dict[type, Any] = _local.__dict__.setdefault("fields", {})
        fields = kept.get(type(self))
        if fields is None:  # DRF's own: deep-copied and bound to this instance
            fields = kept[type(self)] = super().fields  # type: ignore[misc]
            return fields
        # bound once (a field refuses a second bind): only the parent changes, which the
        # fields reach the serializer's context through
        fields.serializer = self
        for field in fields.values():
            field.parent = self
        return fields
