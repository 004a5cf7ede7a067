from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "marketplace.api"
    label = "api"

    def ready(self) -> None:
        from marketplace.api import schema  # noqa: F401 - registers the schema extension
