"""Helpers the web views share."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def not_found(request: HttpRequest, what: str = "page") -> HttpResponse:
    """A 404 page in the site's look. The same answer whether the thing does not exist or
    belongs to someone else: a buyer learns nothing about other buyers' jobs."""
    return render(request, "web/404.html", {"what": what}, status=404)


def wants_json(request: HttpRequest) -> bool:
    """The submit page's script posts with fetch/XHR and asks for JSON; plain forms do not."""
    return "application/json" in request.headers.get("Accept", "")


def problem_lines(text: str, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attach to each spec problem the editor line of its field, when it can be found.

    A field path like "local.steps" is looked up key by key, each below the previous one's
    line, so `steps` under `local:` is found and not another `steps` elsewhere.
    """
    lines = text.splitlines()
    out = []
    for problem in problems:
        line = None
        start = 0
        for key in str(problem.get("field", "")).split("."):
            if not key or key.startswith("<") or key.isdigit():
                continue
            found = next(
                (i for i in range(start, len(lines)) if lines[i].lstrip().startswith(f"{key}:")),
                None,
            )
            if found is None:
                found = next(
                    (i for i in range(start, len(lines)) if f'"{key}"' in lines[i]),
                    None,
                )
            if found is None:
                break
            line, start = found + 1, found + 1
        out.append(problem | {"line": line})
    return out
