"""Bounded nesting for JSON and YAML that strangers send: a depth limit on every parse.

Python's json module and PyYAML both recurse, so very deep input raises RecursionError (a
500 in a web worker) and merely deep input is stored and breaks whoever reads it later. Both
paths end here in one clear TooDeep error. Both also turn an integer longer than Python
converts from text (sys.get_int_max_str_digits, 4,300 digits) into their own parse error, not
the bare ValueError that escaped every caller's `except JSONDecodeError` / `YAMLError`.
"""

from __future__ import annotations

import json
import re
import sys
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
    containers = (dict, list, tuple)
    seen: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, containers) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise TooDeep(limit)
        if seen.get(id(item), 0) >= depth:
            continue
        seen[id(item)] = depth
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, containers):
                stack.append((child, depth + 1))


# a JSON string, or an unterminated one to the end: always matching keeps the scan linear
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.?)*(?:"|\Z)', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def _check_brackets(text: str, strings: re.Pattern[str] | None, limit: int) -> None:
    """Refuse text whose brackets (outside strings) nest deeper than `limit` before parsing
    it: neither parser may see such text, since the json module's C scanner overflows the C
    stack (a segfault) once something raised the recursion limit (py-evm, imported with the
    chain, sets it to 100000), and PyYAML then recurses for minutes before giving up."""
    if text.count("[") + text.count("{") <= limit:
        return  # the common case, at C speed
    depth = 0
    # only the brackets, as one string: iterating it keeps no list of them in memory
    for bracket in _NOT_BRACKETS.sub("", strings.sub("", text) if strings else text):
        depth += 1 if bracket in "[{" else -1
        if depth > limit:
            raise TooDeep(limit)


def loads_json(text: str | bytes, limit: int = MAX_DEPTH, **kwargs: Any) -> Any:
    """json.loads with the depth limit; JSONDecodeError passes through unchanged, `kwargs`
    go to json.loads."""
    if isinstance(text, bytes | bytearray):
        text = text.decode(json.detect_encoding(text), "surrogatepass")  # as json.loads does
    # exact for JSON, whose containers are its brackets: no walk of the result is needed
    _check_brackets(text, _JSON_STRING, limit)
    try:
        return json.loads(text, **kwargs)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # int()'s digit limit; a caller's parse_constant's passes on
        if not _is_digit_limit(exc):
            raise
        raise json.JSONDecodeError(_too_many_digits(), text, 0) from None


def loads_yaml(text: str, limit: int = MAX_DEPTH) -> Any:
    """yaml.safe_load with the depth limit; YAMLError passes through unchanged. YAML's quotes
    are not found without parsing (don't is a plain word), so brackets in strings and comments
    count too: a false refusal needs more than `limit` of them open at once."""
    _check_brackets(text, None, limit)
    try:
        value = yaml.safe_load(text)
    except RecursionError:
        raise TooDeep(limit) from None
    except yaml.YAMLError:
        raise
    except ValueError as exc:  # a constructor's: int()'s digit limit, a date like 2024-13-01
        problem = _too_many_digits() if _is_digit_limit(exc) else str(exc)
        raise yaml.constructor.ConstructorError(problem=problem) from None
    check_depth(value, limit)
    return value


def _is_digit_limit(exc: ValueError) -> bool:
    return "integer string conversion" in str(exc)


def _too_many_digits() -> str:
    return f"a number has more than {sys.get_int_max_str_digits()} digits"
