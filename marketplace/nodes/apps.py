from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "marketplace.nodes"
    label = "nodes"
