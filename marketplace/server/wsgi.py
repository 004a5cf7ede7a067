"""WSGI entry point (`gpuflex serve` runs it under gunicorn)."""

import gc
import os
import sys

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")
application = get_wsgi_application()
# Import every view now (they pull in torch through trainer/), so that a worker's first
# request does not pay seconds of imports while clients wait.
get_resolver().url_patterns  # noqa: B018
# Everything imported so far lives as long as the worker: out of the collector's sight, a
# full collection no longer walks torch's and Django's hundreds of thousands of objects
# (measured: a claim's query building spent most of its time in those pauses).
gc.freeze()
# A claim holds its job's escrow lock (ledger.reservations.Funds) across several database
# round trips, and every claim on the job queues for it; after each round trip the holder
# must win the GIL back from the worker's other threads, which by default may keep it for
# 5 ms. Handing the GIL over sooner halved the time 10,000 tasks took to reach 1,000 nodes
# in the load bench (bench/load_bench.py, cpu_per_request) at no measurable CPU per request.
SWITCH_INTERVAL_S = 0.0005
sys.setswitchinterval(SWITCH_INTERVAL_S)
