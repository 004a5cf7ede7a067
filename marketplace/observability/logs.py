"""JSON log lines (GPUFLEX_LOG_FORMAT=json): one object a line, for a log shipper to index.
Each carries the request id (request_id.RequestIdFilter puts it on the record) and, while a
trace is recorded, the trace and span ids that find the request's spans."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# attributes every LogRecord has: what is left over was passed in `extra=` and is kept
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "request_id",
    "request",  # Django's HttpRequest on django.request records: not JSON
    "server_time",
    "status_code",
}


def _trace_ids() -> dict[str, str]:
    trace = sys.modules.get("opentelemetry.trace")  # only once tracing was set up
    if trace is None:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
            "process": record.process,
        }
        if (status := getattr(record, "status_code", None)) is not None:
            out["status"] = status
        out |= _trace_ids()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        return json.dumps(out, default=str, ensure_ascii=False)


def json_handlers_for_celery(logger: logging.Logger | None = None, **_: Any) -> None:
    """Celery's after_setup_logger: its own lines (the worker's, beat's) in JSON too when
    GPUFLEX_LOG_FORMAT=json; Django's LOGGING already covers `marketplace` and `django`."""
    from django.conf import settings

    if logger is None or getattr(settings, "LOG_FORMAT", "plain") != "json":
        return
    from marketplace.server.request_id import RequestIdFilter

    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())
