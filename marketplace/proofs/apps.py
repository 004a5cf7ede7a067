from django.apps import AppConfig


class ProofsConfig(AppConfig):
    name = "marketplace.proofs"
    label = "proofs"

    def ready(self) -> None:
        # registered in every process: the web enqueues the check by name
        from marketplace.proofs import tasks  # noqa: F401
