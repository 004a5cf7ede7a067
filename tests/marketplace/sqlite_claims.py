"""Run by test_claim_sqlite.py in a fresh process: the embedded SQLite setup, threads
hammering claims. Prints one JSON line with what each thread got."""

from __future__ import annotations

import json
import os
import sys
import threading
from decimal import Decimal

os.environ["DJANGO_SETTINGS_MODULE"] = "marketplace.server.settings.base"
os.environ.pop("DATABASE_URL", None)

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from marketplace.accounts.services import create_user  # noqa: E402
from marketplace.jobs.submission import submit_job  # noqa: E402
from marketplace.ledger.services import grant_credit  # noqa: E402
from marketplace.nodes.services import register_node  # noqa: E402
from marketplace.rounds.models import Task  # noqa: E402
from marketplace.rounds.scheduling import claim_next, lease_batch  # noqa: E402


def main(threads: int, batch: bool = False) -> None:
    assert connection.vendor == "sqlite"
    call_command("migrate", "--noinput", verbosity=0)
    buyer, provider = create_user("b", "buyer"), create_user("p", "provider")
    spec = {
        "name": "sqlite",
        "local": {"steps": 1},
        "model": {"hidden": [8]},
        "sharding": {"method": "random", "num_shards": 40},
    }
    grant_credit(user=buyer, amount="100", memo="test", operator=None)
    submit_job(buyer=buyer, spec_data=spec, tier="volunteer", budget=Decimal(10),
               max_price_per_gpu_hour=Decimal(1))  # fmt: skip
    nodes = [
        register_node(
            owner=provider, name=f"n{i}", kind="volunteer", hardware={"memory_gb": 8},
            benchmark={}, network={}, price_per_gpu_hour=Decimal("0.1"), availability={},
        )[0]
        for i in range(threads)
    ]  # fmt: skip
    claimed: list[list[str]] = [[] for _ in nodes]
    errors: list[str] = []
    barrier = threading.Barrier(len(nodes))

    def run(i: int) -> None:
        try:
            barrier.wait()
            if batch and i == 0:  # one thread bulk-leases to itself while the others claim
                lease_batch([nodes[0]], slots=1000)
                mine = Task.objects.filter(node=nodes[0], status="leased")
                claimed[0].extend(str(pk) for pk in mine.values_list("pk", flat=True))
                return
            while (task := claim_next(nodes[i])) is not None:
                claimed[i].append(str(task.pk))
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(nodes))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    leased = {str(t.pk): t.node_id for t in Task.objects.filter(status="leased")}
    print(json.dumps({"claimed": claimed, "leased": leased, "errors": errors,
                      "nodes": [n.pk for n in nodes]}))  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]), batch=sys.argv[2:] == ["batch"])
