"""Run by test_presence_sqlite.py in a fresh process: the embedded setup (SQLite, no Redis)
through the API: a heartbeat, a claim, a lease kept, offline detection. Prints one JSON
line of what the database holds after each step."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from decimal import Decimal

os.environ["DJANGO_SETTINGS_MODULE"] = "marketplace.server.settings.base"
for name in ("DATABASE_URL", "REDIS_URL"):
    os.environ.pop(name, None)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from marketplace.accounts.services import create_user  # noqa: E402
from marketplace.jobs.submission import submit_job  # noqa: E402
from marketplace.ledger.services import grant_credit  # noqa: E402
from marketplace.nodes import presence  # noqa: E402
from marketplace.nodes.models import Node  # noqa: E402
from marketplace.nodes.services import mark_offline, register_node  # noqa: E402
from marketplace.rounds.models import Task  # noqa: E402


def main() -> None:
    call_command("migrate", "--noinput", verbosity=0)
    buyer, provider = create_user("b", "buyer"), create_user("p", "provider")
    grant_credit(user=buyer, amount="100", memo="test", operator=None)
    spec = {"name": "sqlite", "local": {"steps": 1}, "model": {"hidden": [8]}}
    submit_job(buyer=buyer, spec_data=spec, tier="volunteer", budget=Decimal(10),
               max_price_per_gpu_hour=Decimal(1))  # fmt: skip
    nodes = [
        register_node(
            owner=provider, name=f"n{i}", kind="volunteer", hardware={"memory_gb": 8},
            benchmark={}, network={}, price_per_gpu_hour=Decimal("0.1"), availability={},
        )
        for i in range(2)
    ]  # fmt: skip
    (node, key), (silent, _) = nodes
    http = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    out: dict = {"vendor": connection.vendor, "redis": settings.REDIS_URL}
    beat = {"state": "working", "metrics": {"gpu_util": 0.7}, "network": {"rtt_ms": 9}}
    out["heartbeat"] = http.post("/api/v1/agent/heartbeat", beat, "application/json").status_code
    out["state"] = Node.objects.get(pk=node.pk).state
    out["pending"] = presence.pending()
    Node.objects.filter(pk=node.pk).update(state="offline")
    claim = http.post("/api/v1/agent/claim?max=2")
    out["claim"] = claim.status_code
    out["state_after_claim"] = Node.objects.get(pk=node.pk).state
    task_id = claim.json()["tasks"][0]["id"]
    soon = timezone.now() + timedelta(seconds=5)
    Task.objects.filter(pk=task_id).update(lease_expires=soon)
    beat |= {"task_ids": [task_id]}
    http.post("/api/v1/agent/heartbeat", beat, "application/json")
    out["lease_kept"] = Task.objects.get(pk=task_id).lease_expires > soon + timedelta(seconds=60)
    Node.objects.filter(pk=silent.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    out["offline"] = mark_offline() == [silent.pk]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
