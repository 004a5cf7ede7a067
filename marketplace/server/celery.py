"""The Celery app: `celery -A marketplace.server.celery worker -B` (or `gpuflex worker`)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")

app = Celery("gpuflex")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["marketplace.jobs", "marketplace.ledger"])
