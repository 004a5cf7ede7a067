from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "marketplace.jobs"
    label = "jobs"
