"""WSGI entry point (`gpuflex serve` runs it under granian: server/http_server.py)."""

import gc
import os
from collections.abc import Callable, Iterable
from typing import Any

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")
django_application = get_wsgi_application()

# granian puts the process's whole environment in every request's environ, where Django's
# request.META, and anything that reports it, would show SECRET_KEY and DATABASE_URL. A
# request's environ is what the request brought (CGI variables, HTTP_* headers) and the
# server's wsgi.* keys, as under any other server.
_PROCESS_ONLY = frozenset(
    name
    for name in os.environ
    if not name.startswith("HTTP_")
    and name not in ("CONTENT_TYPE", "CONTENT_LENGTH", "PATH_INFO", "QUERY_STRING",
                     "REQUEST_METHOD", "SCRIPT_NAME", "SERVER_NAME", "SERVER_PORT",
                     "SERVER_PROTOCOL", "REMOTE_ADDR", "REMOTE_HOST")
)  # fmt: skip


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Django's WSGI application, given the request's environ without the process's own
    variables."""
    for name in _PROCESS_ONLY.intersection(environ):
        del environ[name]
    return django_application(environ, start_response)


# Import every view now, so that a worker's first request does not pay their imports while
# clients wait (none imports torch: the Celery worker builds and checks models, issue 36).
get_resolver().url_patterns  # noqa: B018
# Everything imported so far lives as long as the worker: out of the collector's sight, a
# full collection no longer walks Django's hundreds of thousands of objects
# (measured: a claim's query building spent most of its time in those pauses).
gc.freeze()
