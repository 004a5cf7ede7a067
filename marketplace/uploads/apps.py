from django.apps import AppConfig


class UploadsConfig(AppConfig):
    name = "marketplace.uploads"
    label = "uploads"
