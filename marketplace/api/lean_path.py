"""The agent's two hottest requests answered ahead of the middleware and URL resolution they do
not need: a plain heartbeat (api/heartbeat_fast.py) and a plain claim (api/claim_fast.py).

Under the web server the middleware and URL resolution after the operations middleware were about a
third of a heartbeat's CPU (docs/scale.md, fourth pass). `LeanAgentMiddleware` sits after the
request id, metrics and operations middleware (so a lean answer has its X-Request-ID, its log
context and its `/metrics` counts) and runs the middleware after it that acts on such a
request (HTTPS redirect, allowed hosts, refused user agents, security and frame headers)
around the answer as the chain would run it; it skips those that do nothing for it. Any
request those rules would stop or redirect, and every request an answerer leaves (returns
None for), goes down the whole chain to the DRF view. A middleware after this one that is in
neither list (an operator's own) turns the lean path off, rather than being skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, resolve, reverse
from django.utils.module_loading import import_string

from marketplace.api import claim_fast, heartbeat_fast

log = logging.getLogger(__name__)

Answer = Callable[[HttpRequest], "HttpResponse | None"]

# url name -> its lean answer, looked up on each call (tests switch one off by patching it)
ANSWERS: dict[str, Answer] = {
    "agent-heartbeat": lambda request: heartbeat_fast.answer(request),
    "agent-claim": lambda request: claim_fast.answer(request),
}

# What a lean answer skips of the middleware after LeanAgentMiddleware, each because it does
# nothing for these requests: no session is read, the views are CSRF-exempt (DRF's), the
# user is never asked for, no message is stored, axes acts on logins only.
_NOTHING_FOR_AN_AGENT = frozenset(
    {
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "axes.middleware.AxesMiddleware",
    }
)
# ...and what it runs, as the chain would: HTTPS redirect, allowed hosts, refused user agents
# (process_request), the security and frame headers, Content-Length (process_response)
_SITE_RULES = frozenset({
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
})  # fmt: skip


class LeanAgentMiddleware:
    """Answers the requests of `ANSWERS` it can, with the site's rules around the answer."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        after = settings.MIDDLEWARE[settings.MIDDLEWARE.index(_THIS) + 1 :]
        unknown = [m for m in after if m not in _NOTHING_FOR_AN_AGENT | _SITE_RULES]
        self.enabled = not unknown
        if unknown:
            log.info("lean agent path off: the middleware %s may act on agent requests", unknown)
        # instances of the real classes, for their process_request/process_response only
        rules = [import_string(m)(get_response) for m in after if m in _SITE_RULES]
        self.on_request = [r.process_request for r in rules if hasattr(r, "process_request")]
        # innermost first, as a response passes the chain
        self.on_response = [r.process_response for r in reversed(rules)]
        # path -> (url name, the route metrics label), from the URLconf once
        self.paths: dict[str, tuple[str, str]] | None = None

    def _paths(self) -> dict[str, tuple[str, str]]:
        if self.paths is None:
            paths = {}
            for name in ANSWERS:
                try:
                    path = reverse(name)
                except NoReverseMatch:  # a URLconf without the agent API: nothing to answer
                    continue
                paths[path] = (name, "/" + resolve(path).route)
            self.paths = paths
        return self.paths

    def __call__(self, request: HttpRequest) -> HttpResponse:
        found = self._paths().get(request.path_info) if self.enabled else None
        if found is None:
            return self.get_response(request)
        name, route = found
        try:
            if any(check(request) is not None for check in self.on_request):
                return self.get_response(request)  # a redirect: the chain gives it
        except (SuspiciousOperation, PermissionDenied):  # a refused host or user agent
            return self.get_response(request)  # the chain's answer and its log line
        fast = ANSWERS[name](request)
        if fast is None:
            return self.get_response(request)
        request.metrics_route = route  # type: ignore[attr-defined]
        for finish in self.on_response:
            fast = finish(request, fast)
        return fast


_THIS = f"{LeanAgentMiddleware.__module__}.{LeanAgentMiddleware.__qualname__}"
