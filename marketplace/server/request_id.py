"""A request id on every request: taken from X-Request-ID (a proxy's) or made here, sent back
in the response's X-Request-ID and put on every log record written while the request runs, so
a user's report of a failure finds its traceback in the log."""

from __future__ import annotations

import logging
import re
import sys
import uuid
from collections.abc import Callable
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

HEADER = "X-Request-ID"
# a proxy's id is kept only when it cannot forge log lines or bloat them
_VALID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_current: ContextVar[str] = ContextVar("request_id", default="-")


def current_request_id() -> str:
    """The id of the request being served in this thread, "-" outside a request."""
    return _current.get()


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get(HEADER, "")
        request_id = given if _VALID.fullmatch(given) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = _current.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            _current.reset(token)
        response[HEADER] = request_id
        return response


class RequestIdFilter(logging.Filter):
    """Adds record.request_id for the log format; attached to handlers, so it covers every
    logger (Django's, DRF's, ours) and records outside requests ("-")."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = _current.get()
        if request_id == "-":
            # Django logs a 4xx/5xx response after the middleware chain has returned, passing
            # the request along
            request_id = getattr(getattr(record, "request", None), "request_id", "-")
        record.request_id = request_id
        return True


class StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when a record is written, not the one there
    was when logging was configured: a process (a test runner, a daemonizing server) may swap
    and close the original, and a handler bound to it would then fail on every record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass
