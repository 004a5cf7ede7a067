"""The load bench (`python -m bench.run --only load`): 1,000 simulated agents (Locust,
bench/load_agents.py) against `gpuflex serve` on loopback, on the production stack:
gunicorn, PostgreSQL, Redis (presence, key cache, throttles) and a Celery worker whose tick
flushes presence. Each phase is one headless Locust run bounded in time:

1. baseline: every agent asks for the cheapest answer the server gives (a 401 with no key:
   no database, no cache) at the pace of the heartbeat phase;
2. heartbeat: every agent heartbeats once a second (1,000/s offered);
3. claims: every agent claims up to 8 tasks every 5 s from a large job; no task
   may be handed out twice (the answers' ids, and the database, are checked afterwards);
4. schedule: a fresh job of 10,000 tasks; all agents start at once and claim until each
   holds 10: the time from the first claim sent to the last answer received.

    python -m bench.load_bench [--phase-s 60] [--workers 2] [--threads 8]

Prints one JSON line. The machine is shared by the load generator and the server: the
figures say how many gunicorn workers and Locust processes ran.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

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
        # gunicorn's CPU (all workers) per request: the Python cost, without PostgreSQL's
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


def _drain(url: str, deadline_s: float = 60) -> None:
    """Wait until the server answers a trivial request quickly again: requests a phase left
    queued in gunicorn would otherwise be counted against the next phase."""
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
    (gunicorn waits out kept-alive connections, a solo Celery worker its tick)."""
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
) -> dict[str, Any]:
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
        claims_job = _seed_job("load-claims", claim_tasks)
        connection.close()

        url, server = _serve(env, workers, threads)
        worker = _start(["worker", "--pool", "solo", "--loglevel", "WARNING"], env)
        procs = [server, worker]
        out: dict[str, Any] = {
            "agents": agents, "phase_s": phase_s, "gunicorn_workers": workers,
            "gunicorn_threads": threads, "locust_processes": 1, "celery_workers": 1,
            "cpus": os.cpu_count(), "database": "postgresql", "redis": True,
        }  # fmt: skip
        try:
            _wait_listening(url)
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


def render(r: dict[str, Any]) -> list[str]:
    """The load table of results.md."""
    if "error" in r:
        return ["## Load (1,000 Locust agents)", "", f"failed: {r['error']}", ""]
    b, hb, db, cl, sc = (r[k] for k in ("baseline", "heartbeat", "heartbeat_db", "claims",
                                        "schedule"))  # fmt: skip

    def lat(p: dict[str, Any]) -> str:
        cpu = p.get("server_cpu_ms_per_request")
        per_core = f" (server CPU {cpu:.2f} ms each: {1000 / cpu:.0f}/s a core)" if cpu else ""
        return f"p50 {p['p50_ms']:.0f} ms, p99 {p['p99_ms']:.0f} ms{per_core}"

    hb_ok = hb["per_s"] >= GOALS["heartbeats_per_s"] and hb["p99_ms"] < GOALS["heartbeat_p99_ms"]
    cl_ok = cl["tasks_per_s"] >= GOALS["claims_per_s"] and cl["leased_twice"] == 0
    sc_ok = (sc["schedule_s"] or 1e9) < GOALS["schedule_s"] and sc["leased_in_db"] >= 10_000
    return [
        "## Load: 1,000 simulated agents (Locust) against `gpuflex serve`",
        "",
        f"`python -m bench.run --only load`: {r['agents']} Locust users (FastHttpUser, "
        f"{r['locust_processes']} Locust process) against gunicorn ({r['gunicorn_workers']} "
        f"workers × {r['gunicorn_threads']} threads) on PostgreSQL and Redis, with one Celery "
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
    args = parser.parse_args(argv)
    database = os.environ.get("BENCH_LOAD_DATABASE_URL", DEFAULT_DATABASE)
    result = run(agents=args.agents, phase_s=args.phase_s, workers=args.workers,
                 threads=args.threads, database_url=database)  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
