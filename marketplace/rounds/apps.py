from django.apps import AppConfig


class RoundsConfig(AppConfig):
    name = "marketplace.rounds"
    label = "rounds"

    def ready(self) -> None:
        # register the Celery tasks in every process, the web's too: marketplace.rounds.queue
        # enqueues them by name
        from marketplace.rounds import tasks  # noqa: F401
