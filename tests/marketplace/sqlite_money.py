"""Run by test_money_bounds.py in a fresh process: money_scenario on the embedded SQLite
setup. Prints one JSON line with what it saw."""

from __future__ import annotations

import json
import os

os.environ["DJANGO_SETTINGS_MODULE"] = "marketplace.server.settings.base"
os.environ.pop("DATABASE_URL", None)

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.marketplace import money_scenario  # noqa: E402

if __name__ == "__main__":
    assert connection.vendor == "sqlite"
    call_command("migrate", "--noinput", verbosity=0)
    print(json.dumps(money_scenario.run()))
