"""The load bench (`python -m bench.run --only load`): 1,000 simulated agents (Locust,
bench/load_agents.py) against `gpuflex serve` on loopback, on the production stack:
granian, PostgreSQL, Redis (presence, key cache, throttles) and a Celery worker whose tick
flushes presence. First, on the quiet server, `cpu_per_request` (no Locust): the server's
CPU seconds per request for a heartbeat, a claim of 8 tasks and a 401, from the web
server's /proc times around a known number of requests (so the load generator's own CPU, and the
machine's other load, are not in them), then 10,000 tasks to 1,000 nodes through the live
claim endpoint. Then each phase is one headless Locust run bounded in time:

1. baseline: every agent asks for the cheapest answer the server gives (a 401 with no key:
   no database, no cache) at the pace of the heartbeat phase;
2. heartbeat: every agent heartbeats once a second (1,000/s offered);
3. claims: every agent claims up to 8 tasks every 5 s from a large job; no task
   may be handed out twice (the answers' ids, and the database, are checked afterwards);
4. schedule: a fresh job of 10,000 tasks; all agents start at once and claim until each
   holds 10: the time from the first claim sent to the last answer received.

    python -m bench.load_bench [--phase-s 60] [--workers 2] [--threads 8] [--cpu-only]

`python -m bench.request_profile` profiles the same requests in process (cProfile).

Prints one JSON line. The machine is shared by the load generator and the server: the
figures say how many web workers and Locust processes ran.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.marketplace_bench import ROOT, _free_port, _manage, _reset_database, _server_env
from bench.slow_clients_bench import _wait_listening

LOCUSTFILE = Path(__file__).resolve().parent / "load_agents.py"
DEFAULT_DATABASE = "postgres://postgres@127.0.0.1:5432/gpuflex_load"
DEFAULT_REDIS = "redis://127.0.0.1:6379/12"
GOALS = {
    "heartbeats_per_s": 1000,
    "heartbeat_p99_ms": 100,
    "claims_per_s": 300,
    "schedule_s": 2.0,
}


def _seed_nodes(count: int) -> list[str]:
    """`count` nodes with their keys, written straight to the database (registering them
    through the API is not what is measured); returns the plaintext keys."""
    from django.utils import timezone

    from marketplace.accounts import keys
    from marketplace.accounts.models import ApiKey
    from marketplace.accounts.services import create_user
    from marketplace.nodes.models import Node

    provider = create_user("load-provider", "provider")
    nodes = Node.objects.bulk_create(
        Node(owner=provider, name=f"agent-{i}", kind="volunteer", memory_gb=24.0,
             price_per_gpu_hour=Decimal("0.40"), last_heartbeat_at=timezone.now(),
             # a fleet past its probation: a tenth of its tasks replicated, not all
             verified_ok=10, reliability=0.9)
        for i in range(count)
    )  # fmt: skip
    plain = [keys.new_key(keys.NODE_PREFIX) for _ in nodes]
    ApiKey.objects.bulk_create(
        ApiKey(user=provider, node=n, name=f"node {n.name}", prefix=keys.display_prefix(k),
               digest=keys.digest(k))
        for n, k in zip(nodes, plain, strict=True)
    )  # fmt: skip
    return plain


def _seed_job(name: str, tasks: int) -> Any:
    """A running job with one open round of `tasks` pending tasks, its budget in escrow."""
    from django.db import connection
    from django.utils import timezone

    from marketplace.accounts.services import create_user
    from marketplace.jobs.models import Job, Shard
    from marketplace.ledger.services import grant_credit, hold_budget
    from marketplace.rounds.models import Round, Task
    from trainer.spec import parse_spec

    buyer = create_user(f"{name}-buyer", "buyer")
    grant_credit(user=buyer, amount="1000000", memo="load bench", operator=None)
    spec = parse_spec({"name": name, "local": {"steps": 10}}).to_dict()
    job = Job.objects.create(
        buyer=buyer,
        name=name,
        spec=spec,
        tier="hybrid",
        max_price_per_gpu_hour=Decimal("1"),
        budget=Decimal("1000000"),
    )
    hold_budget(job)
    shards = Shard.objects.bulk_create(
        (Shard(job=job, index=i, file=f"{name}/{i}", content_hash="0" * 64, size=100)
         for i in range(tasks)), batch_size=5000,
    )  # fmt: skip
    rnd = Round.objects.create(
        job=job, number=1, input_model_hash="0" * 64, input_model_file=f"{name}/model",
        deadline=timezone.now() + timezone.timedelta(hours=1),
    )  # fmt: skip
    Task.objects.bulk_create(
        (Task(round=rnd, shard=s, seed=i) for i, s in enumerate(shards)), batch_size=5000
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would soon after: plans for real sizes
    return job


def _cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the processes of a process group: the
    server's master and workers. A figure the machine's other load does not inflate."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # pgrp; utime and stime follow at 11 and 12
                total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_s() -> dict[int, float]:
    """pid -> CPU seconds so far of every PostgreSQL backend connected to this database
    (but the bench's own), from /proc (the server runs on this machine)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        pids = [pid for (pid,) in cursor.fetchall()]
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _locust(
    phase: str,
    url: str,
    keys_file: Path,
    work: Path,
    *,
    users: int,
    run_s: float,
    server: subprocess.Popen | None = None,
    **env: Any,
) -> dict[str, Any]:
    """One headless Locust run (one process); its aggregated stats, what it wrote, and the
    server's CPU time per request answered."""
    prefix, out = work / phase, work / f"{phase}.json"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "-u", str(users), "-r", str(users), "-t", f"{int(run_s)}s", "--host", url,
           "--csv", str(prefix), "--only-summary", "--stop-timeout", "10",
           "--loglevel", "ERROR", "--exit-code-on-error", "0"]  # fmt: skip
    child_env = os.environ | {
        "LOAD_PHASE": phase, "LOAD_KEYS": str(keys_file), "LOAD_OUT": str(out),
        **{f"LOAD_{k.upper()}": str(v) for k, v in env.items()},
    }  # fmt: skip
    started = time.monotonic()
    cpu = _cpu_s(server.pid) if server is not None else None
    done = subprocess.run(cmd, env=child_env, cwd=ROOT, capture_output=True, text=True,
                          timeout=run_s + 120, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"locust {phase} failed:\n{done.stderr[-3000:]}")
    with open(f"{prefix}_stats.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    n = int(row["Request Count"])
    cpu = _cpu_s(server.pid) - cpu if server is not None and cpu is not None else None
    with open(f"{prefix}_failures.csv") as f:
        failed = {f"{r['Name']}: {r['Error']}": int(r["Occurrences"]) for r in csv.DictReader(f)}
    return {
        # the machine's 1-minute load average as the phase ends: the server and Locust share
        # its CPUs with whatever else runs
        "load_average": os.getloadavg()[0],
        "requests": n,
        "failures": int(row["Failure Count"]),
        "failure_kinds": failed,
        # the web server's CPU (all workers) per request: the Python cost, without PostgreSQL's
        # and Redis's own; 1,000 / this is what one dedicated core would answer per second
        "server_cpu_ms_per_request": 1000 * cpu / n if cpu is not None and n else None,
        "per_s": n / run_s,
        "p50_ms": float(row["50%"]),
        "p99_ms": float(row["99%"]),
        "locust_s": time.monotonic() - started,
        "out": json.loads(out.read_text()) if out.exists() else {},
    }


def _leases_check(claimed: dict[str, list[str]], node_ids: list[int], job: Any) -> dict:
    """Whether any lease was handed out twice, against the database.

    A task's `attempts` counts its leases; a task may be leased again legitimately once its
    lease was lost (its node silent past the node timeout: an overloaded server that queues
    a node's requests that long has the tick reclaim its work), so a task answered more
    times than it was leased is the violation. The database agrees when every answered
    task that is leased now is leased to one of the agents it was answered to, or was leased
    again after them (to an agent whose answer the time limit cut off)."""
    from django.db.models import Max, Min

    from marketplace.rounds.models import Task

    answered: dict[str, list[int]] = {}
    for i, ids in claimed.items():
        for tid in ids:
            answered.setdefault(tid, []).append(node_ids[int(i)])
    rows = Task.objects.filter(round__job=job, attempts__gt=0)
    columns = rows.values_list("pk", "node_id", "status", "attempts")
    db = {str(pk): (node, status, attempts) for pk, node, status, attempts in columns}
    twice = sum(1 for t, got in answered.items() if len(got) > db.get(t, (None, None, 0))[2])
    again = sum(1 for got in answered.values() if len(got) > 1)
    agrees = all(  # leased now to an agent it was answered to, or leased again since
        t in db and (db[t][1] != "leased" or db[t][0] in got or db[t][2] > len(got))
        for t, got in answered.items()
    )
    leased = Task.objects.filter(round__job=job, status="leased")
    span = leased.aggregate(first=Min("leased_at"), last=Max("leased_at"))
    return {
        "answered": sum(len(got) for got in answered.values()),
        "leased_twice": twice,
        "lost_and_leased_again": again,
        "leased_in_db": leased.count(),
        "db_agrees": agrees,
        "leased_unanswered": len({t for t, v in db.items() if v[1] == "leased"} - answered.keys()),
        "db_lease_span_s": (span["last"] - span["first"]).total_seconds()
        if span["first"]
        else None,
    }


BEAT = {
    "state": "idle",
    "metrics": {"gpu_util": 0.1, "gpu_temp_c": 50, "gpu_mem_used_mb": 100},
    "network": {"rtt_ms": 1, "up_mbps": 1000, "down_mbps": 1000},
}


def _requests_cpu(
    url: str,
    server: subprocess.Popen,
    make: list[tuple[str, str, str | None]],
    *,
    expect: tuple[int, ...],
    threads: int = 4,
) -> dict[str, Any]:
    """Send the requests `make` lists (method, path, key) from `threads` keep-alive clients
    and return the server's CPU seconds per request: its process group's CPU time (master
    and every worker, from /proc) before and after, divided by the requests. The client's
    own CPU is not in it, nor is the rest of the machine's load; PostgreSQL's and Redis's
    CPU is not either (they are other processes)."""
    import httpx

    chunks = [make[i::threads] for i in range(threads)]
    codes: dict[int, int] = {}

    def send(chunk: list[tuple[str, str, str | None]]) -> dict[int, int]:
        seen: dict[int, int] = {}
        with httpx.Client(base_url=url, timeout=60) as http:
            for method, path, key in chunk:
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                if "/claim" in path:  # as the agent claims: a fresh key per claim
                    headers["Idempotency-Key"] = uuid.uuid4().hex
                body = BEAT if path.endswith("heartbeat") else None
                code = http.request(method, path, headers=headers, json=body).status_code
                seen[code] = seen.get(code, 0) + 1
        return seen

    from concurrent.futures import ThreadPoolExecutor

    started, cpu = time.monotonic(), _cpu_s(server.pid)
    with ThreadPoolExecutor(threads) as pool:
        for seen in pool.map(send, chunks):
            for code, n in seen.items():
                codes[code] = codes.get(code, 0) + n
    cpu, wall = _cpu_s(server.pid) - cpu, time.monotonic() - started
    n = len(make)
    return {
        "requests": n,
        "statuses": {str(k): v for k, v in sorted(codes.items())},
        "unexpected": sum(v for k, v in codes.items() if k not in expect),
        "server_cpu_s": cpu,
        "cpu_s_per_request": cpu / n,
        "wall_s": wall,
    }


def cpu_per_request(
    url: str,
    server: subprocess.Popen,
    keys: list[str],
    node_ids: list[int],
    *,
    requests: int = 2000,
    schedule_tasks: int = 10_000,
    threads: int = 4,
    claims: bool = True,
) -> dict[str, Any]:
    """Server CPU per request, independent of the load generator (`_requests_cpu`), for a
    heartbeat, a claim of 8 tasks and a 401 that touches nothing; then `schedule_tasks`
    tasks to every node through the live claim endpoint (each node claims 8 at a time until
    it holds its share), timed from the first claim sent to the last answer, checked
    against the database for leases handed out twice. Without `claims`, the heartbeat and
    the 401 only."""
    from django.db import connection

    from marketplace.jobs.models import Job

    # the jobs the other phases use wait: claims here lease only this section's tasks
    others = list(Job.objects.filter(status="running").values_list("pk", flat=True))
    Job.objects.filter(pk__in=others).update(status="paused")
    try:
        return _cpu_per_request(
            url, server, keys, node_ids, requests, schedule_tasks, threads, claims
        )
    finally:
        Job.objects.filter(pk__in=others).update(status="running")
        connection.close()


# a node's claims in the schedule at most: its first 8, the rest, and retries for what other
# claims held locked when it asked
_CLAIMS_PER_NODE = 5


def _cpu_per_request(
    url: str,
    server: subprocess.Popen,
    keys: list[str],
    node_ids: list[int],
    requests: int,
    schedule_tasks: int,
    threads: int,
    claims: bool = True,
) -> dict[str, Any]:
    from django.db import connection

    from marketplace.jobs.models import Job

    out: dict[str, Any] = {"threads": threads}
    n = min(requests, len(keys) * 4)
    hb = [("POST", "/api/v1/agent/heartbeat", keys[i % len(keys)]) for i in range(n)]
    # warm, and steady state: each node has called once, so its key is in the key cache (as
    # it is for all but one heartbeat in KEY_CACHE_S / the interval: 1 in 30 at the defaults)
    _requests_cpu(url, server, hb[: len(keys)], expect=(200,), threads=threads)
    out["heartbeat"] = _requests_cpu(url, server, hb, expect=(200,), threads=threads)
    out["401"] = _requests_cpu(
        url, server, [("GET", "/api/v1/nodes/", None)] * n, expect=(401,), threads=threads
    )
    # the floor: the web server, Django's WSGI handler and the first middleware, nothing else
    # (OperationsMiddleware answers it ahead of the rest)
    out["healthz"] = _requests_cpu(
        url, server, [("GET", "/healthz", None)] * n, expect=(200,), threads=threads
    )
    if not claims:  # --heartbeat-only
        return _per_core(out)
    job = _seed_job("cpu-claims", 8 * n + 8 * len(keys))
    connection.close()
    claims = [("POST", "/api/v1/agent/claim?max=8", keys[i % len(keys)]) for i in range(n // 4)]
    out["claim"] = _requests_cpu(url, server, claims, expect=(200,), threads=threads)
    out["claim"]["tasks"] = 8
    Job.objects.filter(pk=job.pk).update(status="completed")
    connection.close()

    # the schedule: every node claims (8, then the rest) until it holds its share. A claim
    # skips the tasks other claims hold locked until they commit (spares they read but do
    # not lease included), so near the end a node may get fewer than it asked for: it asks
    # again, a few times, so that the figure is every task reaching a node
    job = _seed_job("cpu-schedule", schedule_tasks)
    connection.close()
    share = -(-schedule_tasks // len(keys))
    claimed: dict[str, list[str]] = {}
    sent = [0] * 64  # claims each client thread sent

    def node_claims(i: int) -> None:
        with _Keepalive(url) as http:
            for j in range(i, len(keys), 64):
                got: list[str] = []
                for attempt in range(_CLAIMS_PER_NODE):
                    if len(got) >= share:
                        break
                    want = min(8, share) if attempt == 0 else share - len(got)
                    headers = {
                        "Authorization": f"Bearer {keys[j]}",
                        "Idempotency-Key": uuid.uuid4().hex,
                    }
                    status, body = http.post(f"/api/v1/agent/claim?max={want}", headers)
                    sent[i] += 1
                    if status == 200:
                        got.extend(t["id"] for t in json.loads(body)["tasks"])
                if got:
                    claimed[str(j)] = got

    from concurrent.futures import ThreadPoolExecutor

    pg = _postgres_cpu_s()
    started, cpu, client = time.monotonic(), _cpu_s(server.pid), time.process_time()
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(node_claims, range(64)))
    wall, cpu = time.monotonic() - started, _cpu_s(server.pid) - cpu
    client = time.process_time() - client
    pg_after = _postgres_cpu_s()
    check = _leases_check(claimed, node_ids, job)
    out["schedule"] = check | {
        "tasks": schedule_tasks, "nodes": len(keys), "claims": sum(sent),
        "client_threads": 64, "wall_s": wall,
        "server_cpu_s": cpu,
        # what else the schedule's wall time spends CPU on, on the same cores: the 64 client
        # threads (this process) and PostgreSQL's backends for this database (those alive at
        # the end: a backend that exited meanwhile is missed, so this is a floor)
        "client_cpu_s": client,
        "postgres_cpu_s": sum(t - pg.get(pid, 0.0) for pid, t in pg_after.items()),
        "load_average_1m": os.getloadavg()[0],
    }  # fmt: skip
    connection.close()
    return _per_core(out)


class _Keepalive:
    """One keep-alive HTTP/1.1 connection on the standard library, for the schedule's
    simulated nodes: a claim costs it about a quarter of httpx's client CPU. The schedule's
    64 client threads share the server's two cores here (a real node's client runs on its
    own machine), so what they spend is taken from the server's wall time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)

    def __enter__(self) -> _Keepalive:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    def post(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        self._conn.request("POST", path, headers=headers)
        reply = self._conn.getresponse()
        return reply.status, reply.read()


def _per_core(out: dict[str, Any]) -> dict[str, Any]:
    out["load_average"] = os.getloadavg()[0]  # the machine's, as the section ends
    hb_s = out["heartbeat"]["cpu_s_per_request"]
    out["nodes_per_core_at_10s_heartbeats"] = 10 / hb_s if hb_s else None
    return out


def _drain(url: str, deadline_s: float = 60) -> None:
    """Wait until the server answers a trivial request quickly again: requests a phase left
    queued in the web server would otherwise be counted against the next phase."""
    import httpx

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        started = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url + "/api/v1/nodes/", timeout=10)
            if time.monotonic() - started < 0.2:
                return
        time.sleep(1)


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "marketplace.cli", *args], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _serve(env: dict[str, str], workers: int, threads: int) -> tuple[str, subprocess.Popen]:
    port = _free_port()
    args = ["serve", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
            "--threads", str(threads), "--no-migrate"]  # fmt: skip
    return f"http://127.0.0.1:{port}", _start(args, env)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL to the process group of whatever is still there after 10 s
    (the web server waits out its requests, a solo Celery worker its tick)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=10)


def run(
    agents: int = 1000,
    phase_s: float = 60,
    workers: int = 2,
    threads: int = 8,
    pace_s: float = 1.0,
    claim_pace_s: float = 5.0,
    claim_tasks: int = 50_000,
    schedule_tasks: int = 10_000,
    database_url: str = DEFAULT_DATABASE,
    redis_url: str = DEFAULT_REDIS,
    cpu_only: bool = False,
    heartbeat_only: bool = False,
) -> dict[str, Any]:
    """Every phase; with `cpu_only`, only the `cpu_per_request` section (no Locust); with
    `heartbeat_only`, only that section's heartbeat and 401."""
    _reset_database(database_url)
    tag = secrets.token_hex(4)
    with tempfile.TemporaryDirectory(prefix="gpuflex-load-") as tmp:
        work = Path(tmp)
        env = _server_env(work / "data", database_url) | {
            "SECRET_KEY": secrets.token_urlsafe(48),
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "GPUFLEX_CELERY_QUEUE": f"load-{tag}",  # no other worker on this broker takes it
            "GPUFLEX_REDIS_PREFIX": f"load-{tag}",
        }  # fmt: skip
        (work / "data").mkdir()
        _manage(env, "migrate", "--noinput", "-v", "0")
        os.environ.update(env)
        import django

        django.setup()
        from django.db import connection
        from django.utils import timezone

        from marketplace.jobs.models import Job
        from marketplace.nodes import presence
        from marketplace.nodes.models import Node

        keys = _seed_nodes(agents)
        node_ids = list(Node.objects.order_by("pk").values_list("pk", flat=True))
        keys_file = work / "keys.json"
        keys_file.write_text(json.dumps(keys))
        claims_job = None if heartbeat_only else _seed_job("load-claims", claim_tasks)
        connection.close()

        url, server = _serve(env, workers, threads)
        worker = _start(["worker", "--pool", "solo", "--loglevel", "WARNING"], env)
        procs = [server, worker]
        out: dict[str, Any] = {
            "agents": agents, "phase_s": phase_s, "web_server": "granian", "web_workers": workers,
            "web_threads": threads, "locust_processes": 1, "celery_workers": 1,
            "cpus": os.cpu_count(), "database": "postgresql", "redis": True,
        }  # fmt: skip
        try:
            _wait_listening(url)
            # first, on a quiet server: what each request costs it, whatever sends them
            print("load: server CPU per request, and the schedule", file=sys.stderr)
            out["cpu_per_request"] = cpu_per_request(url, server, keys, node_ids,
                                                     schedule_tasks=schedule_tasks,
                                                     claims=not heartbeat_only)  # fmt: skip
            if cpu_only or heartbeat_only:
                return out
            print(f"load: baseline, {agents} agents, {phase_s:.0f} s", file=sys.stderr)
            out["baseline"] = _locust(
                "baseline",
                url,
                keys_file,
                work,
                server=server,
                users=agents,
                run_s=phase_s,
                pace_s=pace_s,
            )
            print("load: heartbeats", file=sys.stderr)
            _drain(url)
            since = timezone.now()
            out["heartbeat"] = _locust(
                "heartbeat",
                url,
                keys_file,
                work,
                server=server,
                users=agents,
                run_s=phase_s,
                pace_s=pace_s,
            )
            out["heartbeat"]["waiting_in_redis"] = presence.pending()
            presence.flush()  # what the next tick would write
            out["heartbeat"]["nodes_seen_in_db"] = Node.objects.filter(
                last_heartbeat_at__gte=since
            ).count()

            print("load: claims", file=sys.stderr)
            _drain(url)
            claims = _locust(
                "claims",
                url,
                keys_file,
                work,
                server=server,
                users=agents,
                run_s=phase_s,
                pace_s=claim_pace_s,
            )
            check = _leases_check(claims["out"].get("claimed", {}), node_ids, claims_job)
            claims |= check | {"tasks_per_s": check["answered"] / phase_s}
            out["claims"] = claims
            Job.objects.filter(pk=claims_job.pk).update(status="completed")

            print(f"load: scheduling {schedule_tasks} tasks over {agents} nodes", file=sys.stderr)
            job = _seed_job("load-schedule", schedule_tasks)
            connection.close()
            _drain(url)
            sched = _locust(
                "schedule",
                url,
                keys_file,
                work,
                server=server,
                users=agents,
                run_s=2 * phase_s,
                tasks=-(-schedule_tasks // agents),
            )
            check = _leases_check(sched["out"].get("claimed", {}), node_ids, job)
            first, last = sched["out"].get("first"), sched["out"].get("last")
            sched |= check | {"schedule_s": last - first if first and last else None}
            out["schedule"] = sched

            # the same heartbeats on the database path (no Redis presence, no key cache): what
            # every heartbeat cost before, on this machine in this run
            print("load: heartbeats through the database, for comparison", file=sys.stderr)
            _stop(server)
            direct = env | {"GPUFLEX_PRESENCE_IN_REDIS": "0", "GPUFLEX_KEY_CACHE_S": "0"}
            url, server = _serve(direct, workers, threads)
            procs.append(server)
            _wait_listening(url)
            _drain(url)
            out["heartbeat_db"] = _locust(
                "heartbeat",
                url,
                keys_file,
                work,
                server=server,
                users=agents,
                run_s=phase_s,
                pace_s=pace_s,
            )
        finally:
            for proc in procs:
                _stop(proc)
            connection.close()
    for phase in ("baseline", "heartbeat", "claims", "schedule", "heartbeat_db"):
        out.get(phase, {}).pop("out", None)
    return out


def _met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def web_server(r: dict[str, Any]) -> tuple[str, int, int]:
    """(the server, its workers, threads each) a run measured: results stored before issue
    36's eleventh pass name gunicorn's."""
    if "web_workers" in r:
        return r.get("web_server", "granian"), r["web_workers"], r["web_threads"]
    return "gunicorn", r["gunicorn_workers"], r["gunicorn_threads"]


def render(r: dict[str, Any]) -> list[str]:
    """The load table of results.md."""
    if "error" in r:
        return ["## Load (1,000 Locust agents)", "", f"failed: {r['error']}", ""]
    cpu = render_cpu(r["cpu_per_request"], r) if "cpu_per_request" in r else []
    if "baseline" not in r:  # --cpu-only
        return cpu
    return cpu + _render_locust(r)


CPU_GOALS = {"heartbeat": 0.001, "claim": 0.005, "schedule_s": 10.0, "nodes_per_core": 10_000}


def render_cpu(c: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """The cpu_per_request table of results.md."""
    hb, cl, un, sc = c["heartbeat"], c["claim"], c["401"], c["schedule"]
    scheduled = (
        sc["wall_s"] < CPU_GOALS["schedule_s"]
        and sc["leased_twice"] == 0
        and sc["leased_in_db"] == sc["tasks"]
    )

    def ms(p: dict[str, Any]) -> str:
        return f"{1000 * p['cpu_s_per_request']:.2f} ms ({p['requests']:,} requests)"

    per_core = c["nodes_per_core_at_10s_heartbeats"] or 0
    server, workers, threads = web_server(r)
    return [
        "## Server CPU per request (`cpu_per_request`)",
        "",
        f"`python -m bench.run --only load` (or `python -m bench.load_bench --cpu-only` for this "
        f"section alone): the web server's CPU time ({server}'s main process and all "
        f"{workers} workers × {threads} threads, from /proc) before and after the requests, "
        f"divided by the requests; sent by {c['threads']} keep-alive clients whose own CPU is "
        "not counted, nor PostgreSQL's and Redis's. CPU-seconds per request depend far less on "
        "the machine's other load than wall times (runs with the same code here differed by up "
        "to a quarter); the schedule's wall time depends on it fully (this machine's "
        f"{r['cpus']} CPUs are shared; 1-minute load average as the section ended: "
        f"{c.get('load_average') or 0:.1f}).",
        "",
        "| figure | measured | goal | |",
        "|---|---|---|---|",
        f"| server CPU per heartbeat (Redis presence, cached key) | {ms(hb)} | ≤ 1 ms "
        f"| {_met(hb['cpu_s_per_request'] <= CPU_GOALS['heartbeat'])} |",
        f"| server CPU per claim ({cl['tasks']} tasks) | {ms(cl)} | ≤ 5 ms "
        f"| {_met(cl['cpu_s_per_request'] <= CPU_GOALS['claim'])} |",
        f"| server CPU per 401 (no key: no database, no cache) | {ms(un)} | — | |",
        *(
            [
                f"| server CPU per `/healthz` (the web server and Django's handler alone) "
                f"| {ms(c['healthz'])} | — | |"
            ]
            if "healthz" in c
            else []
        ),
        f"| {sc['tasks']:,} tasks to {sc['nodes']:,} nodes through `POST agent/claim` "
        f"({sc['client_threads']} client threads) | {sc['wall_s']:.1f} s wall, "
        f"{sc['server_cpu_s']:.1f} s server CPU, {sc.get('postgres_cpu_s', 0):.1f} s PostgreSQL's "
        f"(at least), {sc.get('client_cpu_s', 0):.1f} s the client's, on {os.cpu_count()} "
        f"cores; {sc['leased_in_db']:,} leased in {sc.get('claims', 0):,} claims, "
        f"{sc['leased_twice']} twice, database agrees: {sc['db_agrees']} "
        f"| < 10 s, every task, none twice "
        f"| {_met(scheduled)} |",
        f"| nodes one core carries at 10 s heartbeats (10 / CPU s per heartbeat) "
        f"| {per_core:,.0f} | ≥ 10,000 | {_met(per_core >= CPU_GOALS['nodes_per_core'])} |",
        "",
    ]


def _render_locust(r: dict[str, Any]) -> list[str]:
    b, hb, db, cl, sc = (r[k] for k in ("baseline", "heartbeat", "heartbeat_db", "claims",
                                        "schedule"))  # fmt: skip

    def lat(p: dict[str, Any]) -> str:
        cpu = p.get("server_cpu_ms_per_request")
        per_core = f" (server CPU {cpu:.2f} ms each: {1000 / cpu:.0f}/s a core)" if cpu else ""
        return f"p50 {p['p50_ms']:.0f} ms, p99 {p['p99_ms']:.0f} ms{per_core}"

    hb_ok = hb["per_s"] >= GOALS["heartbeats_per_s"] and hb["p99_ms"] < GOALS["heartbeat_p99_ms"]
    cl_ok = cl["tasks_per_s"] >= GOALS["claims_per_s"] and cl["leased_twice"] == 0
    sc_ok = (sc["schedule_s"] or 1e9) < GOALS["schedule_s"] and sc["leased_in_db"] >= 10_000
    server, workers, threads = web_server(r)
    return [
        "## Load: 1,000 simulated agents (Locust) against `gpuflex serve`",
        "",
        f"`python -m bench.run --only load`: {r['agents']} Locust users (FastHttpUser, "
        f"{r['locust_processes']} Locust process) against {server} ({workers} "
        f"workers × {threads} threads) on PostgreSQL and Redis, with one Celery "
        f"worker (solo) whose tick flushes presence; {r['phase_s']:.0f} s a phase, all of it on "
        f"this machine's {r['cpus']} CPUs, which the load generator shares with the server "
        f"(1-minute load average at the end of the heartbeat phase: "
        f"{r['heartbeat'].get('load_average', 0):.1f}). "
        "The baseline is the same agents at the same pace asking for a 401 that touches no "
        "database and no cache.",
        "",
        "| phase | measured | baseline (same run) | goal | |",
        "|---|---|---|---|---|",
        f"| heartbeats (Redis presence, cached keys) | {hb['per_s']:.0f}/s, {lat(hb)}, "
        f"{hb['failures']} failed | {b['per_s']:.0f}/s, {lat(b)} | ≥ 1,000/s, p99 < 100 ms "
        f"| {_met(hb_ok)} |",
        f"| heartbeats through the database (before) | {db['per_s']:.0f}/s, {lat(db)}, "
        f"{db['failures']} failed | (same baseline) | — | |",
        f"| claims (up to 8 tasks each) | {cl['tasks_per_s']:.0f} tasks/s in "
        f"{cl['per_s']:.0f} claims/s, {lat(cl)}; {cl['leased_twice']} leased twice, database "
        f"agrees: {cl['db_agrees']} | {b['per_s']:.0f}/s, {lat(b)} | ≥ 300/s, none twice "
        f"| {_met(cl_ok)} |",
        f"| {sc['leased_in_db']:,} tasks over {r['agents']:,} nodes, every agent claiming at "
        f"once | {_f(sc['schedule_s'])} s first claim sent to last answer "
        f"({_f(sc['db_lease_span_s'])} s between first and last lease in the database); "
        f"{sc['leased_twice']} leased twice | — "
        f"| < 2 s | {_met(sc_ok)} |",
        "",
    ]


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.load_bench")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--phase-s", type=float, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--cpu-only",
        action="store_true",
        help="only the cpu_per_request section (no Locust phases)",
    )
    parser.add_argument(
        "--heartbeat-only",
        action="store_true",
        help="only the cpu_per_request section's heartbeat and 401 (no claims, no schedule)",
    )
    args = parser.parse_args(argv)
    database = os.environ.get("BENCH_LOAD_DATABASE_URL", DEFAULT_DATABASE)
    result = run(agents=args.agents, phase_s=args.phase_s, workers=args.workers,
                 threads=args.threads, database_url=database,
                 cpu_only=args.cpu_only, heartbeat_only=args.heartbeat_only)  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
