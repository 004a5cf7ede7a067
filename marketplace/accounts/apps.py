from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "marketplace.accounts"
    label = "accounts"

    def ready(self) -> None:
        from marketplace.accounts import key_cache

        key_cache.connect()  # revocations reach the API-key cache
