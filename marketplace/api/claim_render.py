"""A claim's reply rendered as DRF's JSONRenderer renders it, each job's spec once.

Every task of a claim carries its job's whole spec (docs/agent-api.md), and the reply holds
its first task twice (`task`, for agents older than `tasks`): a claim of eight from one job
renders the same 2 KB spec nine times, and rendering was about a seventh of a claim's server
CPU under load (issue 36, tenth pass; docs/scale.md). JSON is written piece by piece, so the
reply is rendered with each spec replaced by a token, each distinct spec is rendered once,
and the tokens are replaced by those bytes: the same bytes as rendering it whole.

Tasks of one job carry the same spec (they are built from one Job instance: scheduling's
`share_related`). A token is a string no spec or payload holds: NULs around this process's
random nonce; should one ever appear in the data anyway, the count of tokens in the output
is off and the reply is rendered whole.
"""

from __future__ import annotations

import secrets
from typing import Any

from rest_framework.renderers import JSONRenderer

_RENDERER = JSONRenderer()
_NONCE = secrets.token_hex(8)


def render(data: dict[str, Any]) -> bytes:
    """`JSONRenderer().render(data)` for a claim reply ({"task": ..., "tasks": [...]})."""
    try:
        return _spliced(data)
    except _Whole:
        return _RENDERER.render(data, "application/json")


class _Whole(Exception):
    """The reply is not one to splice: render it whole."""


def _spliced(data: dict[str, Any]) -> bytes:
    if not isinstance(data.get("tasks"), list) or "task" not in data:
        raise _Whole
    specs: dict[str, Any] = {}  # job id -> its spec

    def tokened(task: Any) -> dict[str, Any]:
        if not isinstance(task, dict) or "spec" not in task or "job_id" not in task:
            raise _Whole
        job, spec = str(task["job_id"]), task["spec"]
        known = specs.setdefault(job, spec)
        if known is not spec and known != spec:  # never by construction; then no splicing
            raise _Whole
        return task | {"spec": _token(job)}

    light = data | {"tasks": [tokened(t) for t in data["tasks"]], "task": tokened(data["task"])}
    body = _RENDERER.render(light, "application/json")
    found = 0
    for job, spec in specs.items():
        token = _RENDERER.render(_token(job), "application/json")
        found += body.count(token)
        body = body.replace(token, _RENDERER.render(spec, "application/json"))
    if found != len(light["tasks"]) + 1:  # a token was in the data itself: not to be trusted
        raise _Whole
    return body


def _token(job: str) -> str:
    return f"\0gpuflex-spec:{_NONCE}:{job}\0"
