"""WSGI entry point (`gpuflex serve` runs it under granian: server/http_server.py)."""

import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")
application = get_wsgi_application()
# Import every view now, so that a worker's first request does not pay their imports while
# clients wait (none imports torch: the Celery worker builds and checks models, issue 36).
get_resolver().url_patterns  # noqa: B018
# Everything imported so far lives as long as the worker: out of the collector's sight, a
# full collection no longer walks Django's hundreds of thousands of objects
# (measured: a claim's query building spent most of its time in those pauses).
gc.freeze()
