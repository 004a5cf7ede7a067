"""A heartbeat body checked without DRF's field machinery, for the lean heartbeat path
(heartbeat_fast.py): the body every agent sends, every few seconds.

`plain_body` answers what `HeartbeatSerializer` would validate the body to, or None, which
means "let the serializer decide": for anything but the plain shapes below (a string where a
number goes, a number as text, whitespace a CharField would trim, a runtime, a null where
none is allowed, anything out of bounds) the caller hands the request to the DRF view, whose
serializer gives its own answer and its own 400 naming the field. So a body is never answered
differently here: this check only accepts a subset of what the serializer accepts, with the
same result (tests/marketplace/test_heartbeat_fast.py holds the two to each other).

The bounds are read from the serializer's own fields once, not restated: one place per fact.
"""

from __future__ import annotations

import math
from typing import Any

from rest_framework import serializers

from marketplace.api.serializers.agent import HeartbeatSerializer
from marketplace.api.serializers.node_data import StrictFloatField


def _number_bounds(serializer: serializers.Serializer) -> dict[str, tuple[float, float, bool]]:
    """Each field's (min, max, allow_null); only StrictFloatFields with both bounds (a field
    of another kind would need a check of its own here: refuse to start without one)."""
    out = {}
    for name, field in serializer.fields.items():
        if type(field) is not StrictFloatField or field.min_value is None:
            raise TypeError(f"heartbeat_body: no plain check for {type(field).__name__} {name}")
        if field.max_value is None or field.required:
            raise TypeError(f"heartbeat_body: {name} must be optional and bounded")
        out[name] = (field.min_value, field.max_value, field.allow_null)
    return out


def _fields() -> dict[str, Any]:
    fields = HeartbeatSerializer().fields
    known = {"state", "reason", "task_id", "task_ids", "progress", "metrics", "network", "runtime"}
    if set(fields) != known:  # a field added to the serializer needs a check here too
        raise TypeError(f"heartbeat_body: the serializer's fields are {sorted(fields)}")
    progress = fields["progress"]
    return {
        "states": frozenset(fields["state"].choices),
        "reason_max": fields["reason"].max_length,
        "task_id_max": fields["task_id"].max_length,
        "task_ids_max": fields["task_ids"].max_length,
        "task_ids_item_max": fields["task_ids"].child.max_length,
        "progress": (progress.min_value, progress.max_value),
        "metrics": _number_bounds(fields["metrics"]),
        "network": _number_bounds(fields["network"]),
    }


_F = _fields()


def _text(value: object, max_length: int) -> bool:
    """A string a CharField (trim_whitespace, no blank) keeps exactly as sent: non-empty,
    nothing to trim, within its length, ASCII (so no NUL checks or surrogates to mind)."""
    return (
        type(value) is str
        and 0 < len(value) <= max_length
        and value.isascii()
        and value.isprintable()
        and value.strip() == value
    )


def _number(value: object, low: float, high: float) -> float | None:
    """StrictFloatField's float, or None where that field would refuse it (or, for a bool, a
    NaN or infinity, which JSON cannot carry here anyway)."""
    if type(value) is not int and type(value) is not float:
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past float's range
        return None
    if not math.isfinite(number) or not low <= number <= high:
        return None
    return number


def _figures(data: object, bounds: dict[str, tuple[float, float, bool]]) -> dict | None:
    """A nested serializer of optional numbers, with HeartbeatSerializer's last step: the
    unknown figures (null) left out."""
    if type(data) is not dict:
        return None
    out = {}
    for name, bound in bounds.items():  # in the serializer's order, as DRF's output is
        if name not in data:
            continue
        value = data[name]  # what the serializer does not declare is ignored, as by DRF
        if value is None:
            if not bound[2]:
                return None
            continue
        number = _number(value, bound[0], bound[1])
        if number is None:
            return None
        out[name] = number
    return out


def plain_body(data: object) -> dict[str, Any] | None:
    """HeartbeatSerializer(data=data).validated_data for a plain body, else None (ask the
    serializer)."""
    if type(data) is not dict or "runtime" in data:  # a runtime is rare: the full path
        return None
    state = data.get("state")
    if type(state) is not str or state not in _F["states"]:
        return None
    out: dict[str, Any] = {"state": state}
    reason = data.get("reason", "")
    if reason != "" and not _text(reason, _F["reason_max"]):
        return None
    out["reason"] = reason
    if "task_id" in data:
        task_id = data["task_id"]
        if task_id is not None and not _text(task_id, _F["task_id_max"]):
            return None
        out["task_id"] = task_id
    task_ids = data.get("task_ids", [])
    if type(task_ids) is not list or len(task_ids) > _F["task_ids_max"]:
        return None
    if not all(_text(t, _F["task_ids_item_max"]) for t in task_ids):
        return None
    out["task_ids"] = list(task_ids)
    if "progress" in data:
        progress = data["progress"]
        if progress is not None:
            progress = _number(progress, *_F["progress"])
            if progress is None:
                return None
        out["progress"] = progress
    for name in ("metrics", "network"):
        figures = _figures(data.get(name, {}), _F[name])
        if figures is None:
            return None
        out[name] = figures
    return out
