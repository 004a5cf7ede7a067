from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "marketplace.jobs"
    label = "jobs"

    def ready(self) -> None:
        # register the Celery tasks in every process, the web's too: marketplace.jobs.queue
        # enqueues them by name
        from marketplace.jobs import tasks  # noqa: F401
