"""Marketplace benchmarks: heartbeat throughput/latency against `gpuflex serve` on loopback,
and scheduling 10,000 tasks over 1,000 nodes. Each returns a dict; `main` prints them.

    python -m bench.marketplace_bench     # SQLite in a temp dir (the embedded default)
    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpuflex_bench \
        python -m bench.marketplace_bench

Figures that depend on the machine are also given as a ratio to a baseline measured in the
same run: heartbeats against the cheapest request the server answers (a 401, no database),
bulk scheduling against leasing the same tasks one claim at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_env(data_dir: Path, database_url: str | None) -> dict[str, str]:
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
        "GPUFLEX_DATA_DIR": str(data_dir),
        "GPUFLEX_DEV": "1",  # a loopback server: the data dir's own SECRET_KEY will do
        # the bench measures the server, not the rate limits
        "GPUFLEX_THROTTLE_HEARTBEAT": "100000000/min",
        "GPUFLEX_THROTTLE_KEY": "100000000/min",
    }
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    cmd = [sys.executable, "-m", "marketplace.manage", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _reset_database(database_url: str | None) -> None:
    """A fresh PostgreSQL database for the run (SQLite starts fresh in its temp dir)."""
    if not database_url or not database_url.startswith("postgres"):
        return
    import psycopg

    base, _, name = database_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


async def _hammer(
    url: str, make_request: Any, clients: int, duration_s: float
) -> tuple[list[float], int]:
    """`clients` concurrent loops for `duration_s`; returns (latencies in s, errors)."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:

        async def loop(i: int) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                ok = await make_request(http, i)
                latencies.append(time.perf_counter() - started)
                errors += not ok

        await asyncio.gather(*(loop(i) for i in range(clients)))
    return latencies, errors


def _summary(latencies: list[float], errors: int, duration_s: float) -> dict[str, float]:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100) if len(ordered) > 1 else [0.0] * 99
    return {
        "requests": len(ordered),
        "per_s": len(ordered) / duration_s,
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "errors": errors,
    }


def heartbeat_throughput(
    duration_s: float = 6.0,
    clients: int = 16,
    nodes: int = 64,
    workers: int | None = None,
    threads: int = 8,
    database_url: str | None = None,
) -> dict[str, Any]:
    """Heartbeats/s and latency against `gpuflex serve` (granian) on loopback."""
    workers = workers or max(2, os.cpu_count() or 1)
    _reset_database(database_url)
    with tempfile.TemporaryDirectory(prefix="gpuflex-bench-") as tmp:
        env = _server_env(Path(tmp), database_url)
        _manage(env, "migrate", "--noinput", "-v", "0")
        provider_key = _manage(env, "create_account", "bench", "--role", "provider").strip()
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "marketplace.cli", "serve", "--bind", f"127.0.0.1:{port}",
             "--workers", str(workers), "--threads", str(threads), "--no-migrate"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            node_keys = _register_nodes(url, provider_key, nodes)

            async def heartbeat(http: httpx.AsyncClient, i: int) -> bool:
                headers = {"Authorization": f"Bearer {node_keys[i % len(node_keys)]}"}
                body = {
                    "state": "idle",
                    "metrics": {"gpu_util": 0.1, "gpu_temp_c": 50, "gpu_mem_used_mb": 100},
                    "network": {"rtt_ms": 1, "up_mbps": 1000, "down_mbps": 1000},
                }
                response = await http.post("/api/v1/agent/heartbeat", json=body, headers=headers)
                return response.status_code == 200

            async def unauthorized(http: httpx.AsyncClient, i: int) -> bool:
                response = await http.post("/api/v1/agent/heartbeat", json={})
                return response.status_code == 401

            base = _summary(
                *asyncio.run(_hammer(url, unauthorized, clients, duration_s)), duration_s
            )
            beats = _summary(*asyncio.run(_hammer(url, heartbeat, clients, duration_s)), duration_s)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    return {
        "database": "postgresql" if database_url else "sqlite",
        "workers": workers,
        "threads": threads,
        "clients": clients,
        "nodes": nodes,
        "duration_s": duration_s,
        "heartbeats_per_s": beats["per_s"],
        "p50_ms": beats["p50_ms"],
        "p99_ms": beats["p99_ms"],
        "errors": beats["errors"],
        "baseline_401_per_s": base["per_s"],
        "baseline_p99_ms": base["p99_ms"],
        "ratio_to_baseline": beats["per_s"] / base["per_s"] if base["per_s"] else None,
        "goal": "at least 1,000 heartbeats/s with p99 under 100 ms",
    }


def _register_nodes(url: str, provider_key: str, count: int) -> list[str]:
    headers = {"Authorization": f"Bearer {provider_key}"}
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        while True:  # wait for the server to listen
            try:
                http.get("/api/v1/nodes/")
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        keys = []
        for i in range(count):
            body = {
                "name": f"bench-{i}",
                "kind": "volunteer",
                "hardware": {"gpu_model": "RTX 4090", "memory_gb": 24},
                "price_per_gpu_hour": "0.40",
            }
            response = http.post("/api/v1/nodes/", json=body)
            response.raise_for_status()
            keys.append(response.json()["node_key"])
    return keys


def scheduling(
    tasks: int = 10_000, nodes: int = 1_000, database_url: str | None = None, sample: int = 200
) -> dict[str, Any]:
    """Lease `tasks` pending tasks over `nodes` idle nodes with the bulk scheduler.

    Runs Django in this process against a fresh database; the baseline leases `sample`
    tasks one claim at a time (the long-poll path) and is extrapolated to `tasks`.
    """
    _reset_database(database_url)
    tmp = tempfile.mkdtemp(prefix="gpuflex-bench-")
    os.environ.update(_server_env(Path(tmp), database_url))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    from marketplace.ledger.models import Reservation
    from marketplace.rounds.models import Task

    node_objs, round_ = _seed_scheduling(tasks, nodes)

    from marketplace.rounds.scheduling import claim_next, lease_batch

    started = time.perf_counter()
    leased = lease_batch(node_objs, slots=-(-tasks // nodes))
    bulk_s = time.perf_counter() - started

    # baseline: the same kind of lease, one claim at a time
    Task.objects.filter(round=round_).update(status="pending", node=None)
    Reservation.objects.update(state="released")  # the leases above are given back
    started = time.perf_counter()
    claimed = 0
    for node in node_objs[:sample]:
        claimed += claim_next(node) is not None
    per_claim_s = (time.perf_counter() - started) / max(claimed, 1)
    return {
        "database": "postgresql" if database_url else "sqlite",
        "tasks": tasks,
        "nodes": nodes,
        "leased": leased,
        "bulk_s": bulk_s,
        "one_claim_ms": per_claim_s * 1000,
        "one_by_one_s_extrapolated": per_claim_s * tasks,
        "speedup_vs_one_by_one": per_claim_s * tasks / bulk_s if bulk_s else None,
        "goal": "under 2 s",
    }


def charging(results: int = 2_000) -> dict[str, Any]:
    """Charge `results` credited results through the ledger, as a round's settlement does
    (metering, escrow lock and balance, one balanced transaction each). The baseline, in the
    same process and database: saving each result's settlement fields, which the same loop
    does anyway. Runs after `scheduling`, on its leased tasks."""
    from django.utils import timezone

    from marketplace.ledger.services import charge_result
    from marketplace.rounds.models import Task, TaskResult

    tasks = list(Task.objects.filter(status="leased").select_related("node")[:results])
    now = timezone.now()
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(
        leased_at=now - timezone.timedelta(seconds=30)
    )
    rows = TaskResult.objects.bulk_create(
        TaskResult(task=t, node=t.node, update_file="u", update_hash="h", num_samples=32,
                   compute_s=20.0, cosine=0.5, credited=True, aggregated=True)
        for t in tasks
    )  # fmt: skip
    rows = list(
        TaskResult.objects.filter(pk__in=[r.pk for r in rows]).select_related(
            "task__round__job", "node"
        )
    )
    started = time.perf_counter()
    for r in rows:
        r.save(update_fields=["accepted", "cosine", "rejection", "aggregated", "credited"])
    save_s = time.perf_counter() - started
    started = time.perf_counter()
    for r in rows:
        charge_result(r)
    charge_s = time.perf_counter() - started
    return {
        "results": len(rows),
        "charges_per_s": len(rows) / charge_s,
        "charge_ms": charge_s / len(rows) * 1000,
        "baseline_save_ms": save_s / len(rows) * 1000,
        "ratio_to_baseline": charge_s / save_s if save_s else None,
    }


def _seed_scheduling(tasks: int, nodes: int) -> tuple[list[Any], Any]:
    from django.utils import timezone

    from marketplace.accounts.services import create_user
    from marketplace.jobs.models import Job, Shard
    from marketplace.ledger.services import grant_credit, hold_budget
    from marketplace.nodes.models import Node
    from marketplace.rounds.models import Round, Task
    from trainer.spec import parse_spec

    buyer = create_user("bench-buyer", "buyer")
    provider = create_user("bench-provider", "provider")
    Node.objects.bulk_create(
        Node(
            owner=provider,
            name=f"n{i}",
            kind="platform" if i % 10 == 0 else "volunteer",
            price_per_gpu_hour=Decimal("0.40"),
            memory_gb=24.0,
            last_heartbeat_at=timezone.now(),
        )
        for i in range(nodes)
    )
    spec = parse_spec({"name": "bench", "local": {"steps": 10}}).to_dict()
    job = Job.objects.create(
        buyer=buyer, name="bench", spec=spec, max_price_per_gpu_hour=Decimal("1"), tier="hybrid",
        budget=Decimal("1000000"),
    )  # fmt: skip
    # its budget is held, as a submission holds it: every lease reserves from this escrow
    grant_credit(user=buyer, amount="1000000", memo="bench", operator=None)
    hold_budget(job)
    shards = Shard.objects.bulk_create(
        Shard(job=job, index=i, file=f"bench/{i}", content_hash="0" * 64, size=100)
        for i in range(tasks)
    )
    round_ = Round.objects.create(
        job=job, number=1, input_model_hash="0" * 64, input_model_file="bench/model",
        deadline=timezone.now() + timezone.timedelta(hours=1),
    )  # fmt: skip
    Task.objects.bulk_create(
        (Task(round=round_, shard=s, seed=i) for i, s in enumerate(shards)), batch_size=2000
    )
    return list(Node.objects.order_by("pk")), round_


def main() -> None:
    database_url = os.environ.get("BENCH_DATABASE_URL")
    results = {
        "heartbeat": heartbeat_throughput(database_url=database_url),
        "scheduling": scheduling(database_url=database_url),
    }
    results["charging"] = charging()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
