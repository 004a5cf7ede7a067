"""A serializer's output written as plain dicts, for a reply on the hot path.

DRF's `Serializer.to_representation` walks its bound fields per object: a `get_attribute`
with its exception handling, a `SkipField` for every optional field that is absent, a
nested serializer per task. For a claim of eight (nine task serializers, their model
sources) that was about a tenth of the claim's CPU (issue 36's profile). `PlainWriter`
reads the same declaration once (the fields, their order, required, default, nesting) and
writes each mapping with a loop over it; every leaf value still goes through its own field's
`to_representation`, so numbers, datetimes and choices come out exactly as DRF writes them.
The declared serializer stays the schema's; tests/marketplace/test_plain_reply.py holds the
two to the same output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rest_framework import serializers
from rest_framework.fields import empty

# a field's plan: (name, when absent, default, how to write a value that is not None)
_Plan = tuple[str, str, Any, Callable[[Any], Any]]
_DEFAULT, _NULL, _SKIP, _REQUIRED = "default", "null", "skip", "required"


class PlainWriter:
    """Writes mappings as `serializer_class(data).data` does (read-only output only)."""

    def __init__(self, serializer_class: type[serializers.Serializer]) -> None:
        self._class = serializer_class
        self._write: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        if self._write is None:  # built on first use: fields need the apps loaded
            self._write = _nested(self._class())
        return self._write(data)


def _plan_of(serializer: serializers.Serializer) -> list[_Plan]:
    plan = []
    for name, field in serializer.fields.items():
        if field.write_only:
            continue
        if field.source != name:  # not a plain key: nothing here reads attributes
            raise TypeError(f"{type(serializer).__name__}.{name}: source {field.source!r}")
        if getattr(field.default, "requires_context", False):
            raise TypeError(f"{type(serializer).__name__}.{name}: a default needing context")
        # what DRF's Field.get_attribute does with a missing key, in its order
        if field.default is not empty:
            absent = _DEFAULT
        elif field.allow_null:
            absent = _NULL
        else:
            absent = _REQUIRED if field.required else _SKIP
        plan.append((name, absent, field.default, _writer(field)))
    return plan


# fields whose to_representation is exactly a builtin (DRF's own method, not overridden):
# the builtin is called directly, one Python call less per value
_BUILTIN: dict[Any, Callable[[Any], Any]] = {
    serializers.IntegerField.to_representation: int,
    serializers.CharField.to_representation: str,
    serializers.FloatField.to_representation: float,
}


def _writer(field: serializers.Field) -> Callable[[Any], Any]:
    if isinstance(field, serializers.ListSerializer):
        child = _nested(field.child)
        return lambda items: [child(item) for item in items]
    if isinstance(field, serializers.Serializer):
        return _nested(field)
    method = type(field).to_representation
    if method in _BUILTIN:
        return _BUILTIN[method]
    if method is serializers.UUIDField.to_representation and field.uuid_format == "hex_verbose":
        return str
    return field.to_representation


def _nested(serializer: serializers.BaseSerializer) -> Callable[[Any], dict[str, Any]]:
    plan = _plan_of(serializer)  # type: ignore[arg-type]

    def write(data: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, absent, default, leaf in plan:
            if name in data:
                value = data[name]
            elif absent == _DEFAULT:
                value = default() if callable(default) else default
            elif absent == _NULL:
                value = None
            elif absent == _SKIP:
                continue
            else:
                raise KeyError(name)
            out[name] = None if value is None else leaf(value)
        return out

    return write
