"""Where a request's server CPU goes, in process: the agent endpoints called as the web
server calls them (Django's WSGI handler, the full middleware stack) against PostgreSQL and Redis,
many times, under cProfile or just timed with the process's CPU clock.

    python -m bench.request_profile [--requests 2000] [--profile KIND] [--kinds K,K,...]

Prints one JSON line: CPU ms per request and database queries per request for a heartbeat,
the same heartbeat through the DRF view alone (`heartbeat_drf`: the lean path,
api/heartbeat_fast.py, switched off), a claim of 8 tasks, the same claim through the DRF view
(`claim_drf`: api/claim_fast.py off), a 401 (no key) and /healthz (the floor: Django's
handler and the first middleware only); with --profile, the cProfile of that kind (top
functions by cumulative time) on stderr; --kinds runs only those kinds. The figures are this
process's CPU time, which the machine's other load does not inflate; PostgreSQL's own CPU is
given beside them (`postgres_cpu_ms_per_request`, its backend's time on the CPU, and each
statement's share in `postgres_statements`); Redis's is not.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.marketplace_bench import _manage, _reset_database, _server_env

DEFAULT_DATABASE = "postgres://postgres@127.0.0.1:5432/gpuflex_reqprof"
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
BEAT = json.dumps(
    {
        "state": "idle",
        "metrics": {"gpu_util": 0.1, "gpu_temp_c": 50, "gpu_mem_used_mb": 100},
        "network": {"rtt_ms": 1, "up_mbps": 1000, "down_mbps": 1000},
    }
).encode()


def _call(
    app: Callable, method: str, path: str, key: str | None, body: bytes = b"", **headers: str
) -> int:
    """One request through the WSGI application, as the web server hands it over."""
    path, _, query = path.partition("?")
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
        "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }  # fmt: skip
    if key:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    environ |= {f"HTTP_{name.upper()}": value for name, value in headers.items()}
    status: list[str] = []
    result = app(environ, lambda s, h, exc_info=None: status.append(s))
    b"".join(result)
    if hasattr(result, "close"):
        result.close()
    return int(status[0].split()[0])


KINDS = ("heartbeat", "heartbeat_drf", "claim", "claim_drf", "401", "healthz")


class _Backend:
    """PostgreSQL's own CPU for the requests: its backend process's time on the CPU, from
    /proc/PID/schedstat (nanoseconds), read before and after the whole run and around each
    statement, so each statement's share is its own (the commit and anything outside a
    statement is the rest). The backend must live through the run: CONN_MAX_AGE is raised
    for the bench (`run`). Where it cannot be read (not PostgreSQL, not this machine's), it
    reports nothing."""

    def __init__(self, connection: Any) -> None:
        self.path: Path | None = None
        self.by_statement: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        if connection.vendor == "postgresql":
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                path = Path(f"/proc/{cursor.fetchone()[0]}/schedstat")
            self.path = path if path.exists() else None
        self.start = self._ns()

    def _ns(self) -> int:
        return int(self.path.read_text().split()[0]) if self.path is not None else 0

    def statement(self, execute: Callable, sql: str, params: Any, many: bool, context: Any):
        before = self._ns()
        try:
            return execute(sql, params, many, context)
        finally:
            label = _label(sql)
            self.by_statement[label] = self.by_statement.get(label, 0) + self._ns() - before
            self.counts[label] = self.counts.get(label, 0) + 1

    def figures(self, n: int) -> dict[str, Any]:
        if self.path is None:
            return {}
        total = self._ns() - self.start
        return {
            "postgres_cpu_ms_per_request": total / 1e6 / n,
            # label -> [statements per request, PostgreSQL CPU ms per request]
            "postgres_statements": {
                label: [self.counts[label] / n, ns / 1e6 / n]
                for label, ns in sorted(self.by_statement.items(), key=lambda kv: -kv[1])
            },
        }


def _label(sql: str) -> str:
    """A statement's name in the figures: the claim's own by what they do, others by their
    first words."""
    text = " ".join(sql.split())
    named = (
        ("gpuflex_reserve", "reserve (gpuflex_reserve)"),
        ("WITH affine", "candidates"),
        ("ARRAY(SELECT", "node and open rounds"),
    )
    for marker, label in named:
        if marker in text:
            return label
    return text[:48]


def run(
    requests: int = 2000, profile: str | None = None, top: int = 45, kinds: Any = KINDS
) -> dict[str, Any]:
    database_url = os.environ.get("BENCH_PROFILE_DATABASE_URL", DEFAULT_DATABASE)
    _reset_database(database_url)
    with tempfile.TemporaryDirectory(prefix="gpuflex-reqprof-") as tmp:
        env = _server_env(Path(tmp) / "data", database_url) | {
            "SECRET_KEY": secrets.token_urlsafe(48),
            "REDIS_URL": os.environ.get("BENCH_PROFILE_REDIS_URL", DEFAULT_REDIS),
            "GPUFLEX_REDIS_PREFIX": f"reqprof-{secrets.token_hex(4)}",
            "GPUFLEX_DEV": "0",
            "ALLOWED_HOSTS": "127.0.0.1",
            # one backend for the whole run, so its CPU is read from one process (_Backend)
            "CONN_MAX_AGE": "3600",
        }
        (Path(tmp) / "data").mkdir()
        _manage(env, "migrate", "--noinput", "-v", "0")
        os.environ.update(env)
        import django

        django.setup()
        from django.core.wsgi import get_wsgi_application
        from django.db import connection

        from bench.load_bench import _seed_job, _seed_nodes

        claims_per_node = 4
        node_count = max(50, requests // claims_per_node)
        keys = _seed_nodes(node_count)
        # claim and claim_drf: n claims of 8 each, with their warm-up calls
        _seed_job("reqprof", node_count * claims_per_node * 8 * 2 + 8 * 2 * 60)
        app = get_wsgi_application()
        from marketplace.api import claim_fast, heartbeat_fast

        def drf_only(module: Any, call: Callable[[int], int]) -> Callable[[int], int]:
            """`call` with the module's lean answer off: the DRF view answers."""

            def through_drf(i: int) -> int:
                lean = module.answer
                module.answer = lambda request: None
                try:
                    return call(i)
                finally:
                    module.answer = lean

            return through_drf

        def heartbeat(i: int) -> int:
            return _call(app, "POST", "/api/v1/agent/heartbeat", keys[i % len(keys)], BEAT)

        def claim(i: int) -> int:  # as the agent claims: a fresh Idempotency-Key per claim
            return _call(app, "POST", "/api/v1/agent/claim?max=8", keys[i % len(keys)],
                         IDEMPOTENCY_KEY=uuid.uuid4().hex)  # fmt: skip

        calls: dict[str, Callable[[int], int]] = {
            "heartbeat": heartbeat,
            "heartbeat_drf": drf_only(heartbeat_fast, heartbeat),
            "claim": claim,
            "claim_drf": drf_only(claim_fast, claim),
            "401": lambda i: _call(app, "GET", "/api/v1/nodes/", None),
            "healthz": lambda i: _call(app, "GET", "/healthz", None),
        }  # fmt: skip
        expect = {"heartbeat": 200, "heartbeat_drf": 200, "claim": 200, "claim_drf": 200,
                  "401": 401, "healthz": 200}  # fmt: skip
        # steady state: each node has called before, so its key is in the key cache (as
        # it is for all but one call in KEY_CACHE_S / heartbeat interval: 1 in 30 at the
        # defaults); a first lookup in the database is not what a heartbeat costs
        for i in range(len(keys)):
            assert calls["heartbeat"](i) == 200
        out: dict[str, Any] = {"requests": requests}
        for name, call in calls.items():
            if name not in kinds:
                continue
            n = requests if "claim" not in name else min(requests, node_count * claims_per_node)
            for i in range(min(50, n)):  # warm: first-request imports, the key cache
                assert call(i) == expect[name], f"{name} answered {call(i)}"
            queries: list[str] = []

            def count(execute, sql, params, many, context, seen=queries):
                seen.append(sql[:160])
                return execute(sql, params, many, context)

            with connection.execute_wrapper(count):
                call(n)
            # timed by this process's CPU clock, as the figure is: with the wall clock the
            # profile is mostly the waits on PostgreSQL, which the machine's load inflates
            prof = cProfile.Profile(time.process_time) if profile == name else None
            backend = _Backend(connection)
            cpu = time.process_time()
            if prof:
                prof.enable()
            with connection.execute_wrapper(backend.statement):
                for i in range(n):
                    code = call(i)
                    if code != expect[name]:
                        raise SystemExit(f"{name} {i}: {code}")
            if prof:
                prof.disable()
            cpu = time.process_time() - cpu
            out[name] = {
                "requests": n,
                "cpu_ms_per_request": 1000 * cpu / n,
                "queries_per_request": len(queries),
                "queries": queries,
            } | backend.figures(n)
            if prof:
                text = io.StringIO()
                order = os.environ.get("PROFILE_SORT", "cumulative")
                pstats.Stats(prof, stream=text).sort_stats(order).print_stats(top)
                print(text.getvalue(), file=sys.stderr)
        connection.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.request_profile")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--profile", choices=KINDS)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS)
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"--kinds: no such kind {sorted(unknown)}; the kinds are {', '.join(KINDS)}")
    print(json.dumps(run(args.requests, args.profile, args.top, kinds)))


if __name__ == "__main__":
    main()
