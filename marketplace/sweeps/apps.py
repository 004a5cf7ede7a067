from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "marketplace.sweeps"
    label = "sweeps"

    def ready(self) -> None:
        # the sweep's task is enqueued by name from the round and job lifecycles
        from marketplace.sweeps import tasks  # noqa: F401
