"""Node names as labels that fit a small space and still tell nodes apart.

The demo's nodes are `volunteer-wan-a`, `volunteer-wan-b`, …: cut to their first 14 (or 10)
characters they all read `volunteer-wan-` (`volunteer…`), the one part that differs gone.
Where a label must be short (the job page's network map) it keeps the name's start and end
and elides the middle; where it may wrap (the operator's latency table) it breaks after the
name's separators. Either way the full name goes in a tooltip (title, SVG <title>).
"""

from __future__ import annotations

import re

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

ELLIPSIS = "…"
_SEPARATORS = re.compile(r"([-_./ ])")


def short_label(name: str, width: int) -> str:
    """`name` in at most `width` characters: whole when it fits, else its start, an ellipsis
    and its end (where names made in series differ: `volunt…wan-a`)."""
    if len(name) <= width:
        return name
    if width < 3:
        return name[:width]
    tail = max(1, (width - 1) // 2)
    head = width - 1 - tail
    return f"{name[:head]}{ELLIPSIS}{name[-tail:]}"


def short_labels(names: list[str], width: int) -> list[str]:
    """`short_label` of each name; where two still read the same, their ends are kept
    instead (the tooltip has the rest)."""
    labels = [short_label(n, width) for n in names]
    seen: dict[str, int] = {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
    return [
        f"{ELLIPSIS}{name[-(width - 1) :]}" if seen[label] > 1 and len(name) > width else label
        for name, label in zip(names, labels, strict=True)
    ]


def wrappable(name: str) -> SafeString:
    """The name, escaped, with a line-break opportunity (<wbr>) after each separator, so a
    narrow table header wraps it as `volunteer-` / `wan-a` instead of cutting it."""
    parts = _SEPARATORS.split(name)
    out = []
    for part in parts:
        out.append(escape(part))
        if part and _SEPARATORS.fullmatch(part):
            out.append("<wbr>")
    return mark_safe("".join(out))
