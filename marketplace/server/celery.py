"""The Celery app: `celery -A marketplace.server.celery worker -B` (or `gpuflex worker`)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, bootsteps
from celery.signals import after_setup_logger, after_setup_task_logger, worker_init
from click import Option

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")

app = Celery("gpuflex")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["marketplace.rounds", "marketplace.ledger", "marketplace.jobs"])


class ThreadedBeat(bootsteps.StartStopStep):
    """`worker --beat-thread`: the periodic tick's clock as a thread of the worker. Celery's
    own `-B` forks a process for it, which holds a copy-on-write share of all the worker has
    imported (some 150 MB once torch is in) to send a message a second."""

    label = "Beat (thread)"

    def __init__(self, parent: Any, beat_thread: bool = False, **options: Any) -> None:
        self.enabled = beat_thread
        super().__init__(parent, **options)

    def create(self, worker: Any) -> Any:
        from celery.beat import EmbeddedService

        return EmbeddedService(worker.app, thread=True, schedule_filename=worker.schedule_filename)


app.user_options["worker"].add(
    Option(("--beat-thread",), is_flag=True, default=False,
           help="Run the beat scheduler as a thread of this worker (instead of -B's process).")
)  # fmt: skip
app.steps["worker"].add(ThreadedBeat)


def _json_logs(**kwargs: Any) -> None:
    from marketplace.observability.logs import json_handlers_for_celery

    json_handlers_for_celery(**kwargs)


# GPUFLEX_LOG_FORMAT=json reaches Celery's own log lines too (observability/logs.py)
after_setup_logger.connect(_json_logs, weak=False)
after_setup_task_logger.connect(_json_logs, weak=False)


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    """`gpuflex worker --metrics-port`: this host's counters for Prometheus (observability)."""
    from marketplace.observability.worker_exporter import serve_from_env

    serve_from_env()
