from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "marketplace.accounts"
    label = "accounts"
