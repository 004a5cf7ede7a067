"""The Django project: settings, URLs, WSGI and the Celery app."""

from marketplace.server.celery import app as celery_app

__all__ = ["celery_app"]
