"""Bounded nesting for JSON and YAML that strangers send: a depth limit on every parse.

Python's json module and PyYAML both recurse, so very deep input raises RecursionError (a
500 in a web worker) and merely deep input is stored and breaks whoever reads it later. Both
paths end here in one clear TooDeep error.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

# A job spec is four levels deep and node data two or three: 32 leaves room and stops abuse.
MAX_DEPTH = 32


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"nested deeper than {limit} levels")


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep if containers nest more than `limit` levels ({} is one level).

    Iterative, and a container shared through YAML aliases is walked again only when reached
    deeper than before, so an alias bomb costs linear time and a self-referencing one is too
    deep instead of endless."""
    seen: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > limit:
            raise TooDeep(limit)
        if seen.get(id(item), 0) >= depth:
            continue
        seen[id(item)] = depth
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)


def loads_json(text: str | bytes, limit: int = MAX_DEPTH) -> Any:
    """json.loads with the depth limit; JSONDecodeError passes through unchanged."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(limit) from None
    check_depth(value, limit)
    return value


def loads_yaml(text: str, limit: int = MAX_DEPTH) -> Any:
    """yaml.safe_load with the depth limit; YAMLError passes through unchanged."""
    try:
        value = yaml.safe_load(text)
    except RecursionError:
        raise TooDeep(limit) from None
    check_depth(value, limit)
    return value
