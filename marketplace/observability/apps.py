from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "marketplace.observability"
    label = "observability"
    verbose_name = "Observability"

    def ready(self) -> None:
        # traces only when an OTLP endpoint is configured; a no-op (no import) otherwise
        from marketplace.observability.tracing import configure_from_env

        configure_from_env()
