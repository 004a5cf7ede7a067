from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "marketplace.jobs"
    label = "jobs"

    def ready(self) -> None:
        # register the Celery tasks in every process, the web's too: submission enqueues
        # the job's preparation by name (jobs/preparation.py)
        from marketplace.jobs import tasks  # noqa: F401
