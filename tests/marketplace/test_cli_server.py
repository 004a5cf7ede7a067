"""`gpuflex serve`, `worker` and `manage` start the right programs with the right settings."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from typing import Any

import pytest

from marketplace import cli


@pytest.fixture
def calls(monkeypatch) -> list[tuple[list[str], dict[str, Any]]]:
    seen: list[tuple[list[str], dict[str, Any]]] = []

    def fake(cmd: list[str], **kwargs: Any) -> int:
        seen.append((cmd, kwargs))
        return 0

    monkeypatch.setattr(cli, "_exec", lambda cmd, env: fake(cmd, env=env))
    monkeypatch.setattr(cli.subprocess, "run", fake)
    return seen


def test_serve_migrates_then_runs_granian_threads(calls, monkeypatch) -> None:
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    monkeypatch.delenv("GPUFLEX_TRUSTED_PROXIES", raising=False)
    argv = ["serve", "--bind", "0.0.0.0:9000", "--workers", "3", "--threads", "5",
            "--behind-proxy"]  # fmt: skip
    assert cli.main(argv) == 0
    (migrate, _), (serve, kwargs) = calls
    assert migrate[-4:] == ["migrate", "--noinput", "-v", "0"]
    assert serve[0].endswith("granian") and serve[-1] == "marketplace.server.wsgi:application"
    assert serve[serve.index("--interface") + 1] == "wsgi"
    assert serve[serve.index("--host") + 1] == "0.0.0.0"
    assert serve[serve.index("--port") + 1] == "9000"
    assert serve[serve.index("--workers") + 1] == "3"
    assert serve[serve.index("--blocking-threads") + 1] == "5"
    assert "--respawn-failed-workers" in serve
    assert kwargs["env"]["DJANGO_SETTINGS_MODULE"]
    assert kwargs["env"]["GPUFLEX_TRUSTED_PROXIES"] == "1"  # nginx's forwarded headers believed
    # no access log unless asked for (one sent to /dev/null is still formatted per request)
    assert "--access-log" not in serve
    calls.clear()
    assert cli.main([*argv, "--access-log"]) == 0
    assert "--access-log" in calls[-1][0]


@pytest.mark.parametrize(
    ("bind", "where"),
    [
        ("127.0.0.1:8000", ["--host", "127.0.0.1", "--port", "8000"]),
        ("[::1]:8001", ["--host", "::1", "--port", "8001"]),
        ("localhost", ["--host", "127.0.0.1", "--port", "8000"]),  # granian takes addresses
        ("unix:/run/gpuflex.sock", ["--uds", "/run/gpuflex.sock"]),
    ],
)
def test_serve_passes_the_bind_address_on(calls, monkeypatch, bind, where) -> None:
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    assert cli.main(["serve", "--bind", bind, "--no-migrate"]) == 0
    serve = calls[-1][0]
    start = serve.index(where[0])
    assert serve[start : start + len(where)] == where


@pytest.mark.parametrize(
    ("bind", "named"),
    [("fd://3", "inherited socket"), ("127.0.0.1:http", "'http'"),
     ("127.0.0.1:70000", "'70000'"), ("unix:", "needs a path"),
     ("no-such-host.invalid:8000", "does not resolve")],
)  # fmt: skip
def test_serve_refuses_a_bind_it_cannot_listen_on(calls, monkeypatch, capsys, bind, named) -> None:
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    monkeypatch.setenv("GPUFLEX_TRUSTED_PROXIES", "1")
    assert cli.main(["serve", "--bind", bind]) == 2
    assert calls == []  # neither migrated nor started
    err = capsys.readouterr().err
    assert f"--bind {bind}" in err and named in err


@pytest.mark.parametrize("bind", ["0.0.0.0:8000", "[::]:8000", "10.0.0.5:8000", "8000",
                                  "example.org:8000"])  # fmt: skip
def test_serve_alone_refuses_a_reachable_address(calls, monkeypatch, capsys, bind) -> None:
    """#38 finding 12: the server alone on a public address, 40 slow bodies stalled honest
    requests; reachable only with a proxy declared in front."""
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    monkeypatch.delenv("GPUFLEX_TRUSTED_PROXIES", raising=False)
    assert cli.main(["serve", "--bind", bind]) == 2
    assert calls == []  # neither migrated nor started
    assert "--behind-proxy" in capsys.readouterr().err
    monkeypatch.setenv("GPUFLEX_TRUSTED_PROXIES", "1")  # declared in the environment
    # a host name is resolved to the address granian listens on (no DNS here: a stand-in)
    fake = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.7", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: fake)
    assert cli.main(["serve", "--bind", bind]) == 0 and len(calls) == 2
    serve = calls[-1][0]
    expected = {"0.0.0.0:8000": "0.0.0.0", "[::]:8000": "::", "10.0.0.5:8000": "10.0.0.5",
                "8000": "0.0.0.0", "example.org:8000": "192.0.2.7"}  # fmt: skip
    assert serve[serve.index("--host") + 1] == expected[bind]


@pytest.mark.parametrize("bind", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000",
                                  "unix:/run/gpuflex.sock"])  # fmt: skip
def test_serve_alone_may_listen_on_loopback(calls, monkeypatch, bind) -> None:
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    monkeypatch.delenv("GPUFLEX_TRUSTED_PROXIES", raising=False)
    assert cli.main(["serve", "--bind", bind]) == 0
    assert "GPUFLEX_TRUSTED_PROXIES" not in calls[-1][1]["env"]


def test_the_serve_command_refuses_a_public_bind_without_a_traceback(tmp_path) -> None:
    """The real entry point, as an operator runs it: a clear line and exit status 2."""
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEX_TRUSTED_PROXIES"}
    env |= {"SECRET_KEY": secrets.token_urlsafe(50), "GPUFLEX_DATA_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "marketplace.cli", "serve", "--bind", "0.0.0.0:8000"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "gpuflex serve: --bind 0.0.0.0:8000 is reachable" in run.stderr
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.iterdir())  # nothing migrated


def test_worker_runs_celery_with_beat(calls) -> None:
    assert cli.main(["worker"]) == 0
    ((cmd, _),) = calls
    assert cmd[0].endswith("celery") and "marketplace.server.celery" in cmd
    assert "--beat-thread" in cmd and cmd[cmd.index("--pool") + 1] == "prefork"
    assert cmd[cmd.index("-Q") + 1] == "gpuflex,gpuflex.aggregation"  # every queue
    calls.clear()
    cli.main(["worker", "--no-beat", "--pool", "solo", "--queues", "aggregation"])
    cmd = calls[0][0]
    assert "--beat-thread" not in cmd and "solo" in cmd
    assert cmd[cmd.index("-Q") + 1] == "gpuflex.aggregation"
    calls.clear()
    assert cli.main(["beat"]) == 0
    assert calls[0][0][3] == "beat"


def test_aggregation_has_a_queue_of_its_own(settings) -> None:
    """A big job's aggregation waits in its own queue; the tick and settlement never behind it."""
    from marketplace.server.celery import app
    from marketplace.server.routing import AGGREGATE_ROUND

    route = app.amqp.router.route
    default = app.conf.task_default_queue
    assert route({}, AGGREGATE_ROUND)["queue"].name == f"{default}.aggregation"
    for name in ("marketplace.jobs.tasks.tick", "marketplace.ledger.tasks.settle_chain"):
        assert route({}, name)["queue"].name == default


def test_manage_passes_through(db, capsys) -> None:
    assert cli.main(["manage", "check"]) == 0
    assert "no issues" in capsys.readouterr().out


PUBLIC_KEY = "gpuflex-development-key-not-for-production-use-0000"


@pytest.mark.parametrize("key", [None, "", PUBLIC_KEY, "short", "django-insecure-" + "x" * 60])
def test_serve_refuses_a_public_or_missing_secret_key(calls, monkeypatch, capsys, key) -> None:
    """#20 finding 7: `gpuflex serve` ran on the base settings' public constant key."""
    monkeypatch.delenv("GPUFLEX_DEV", raising=False)
    if key is None:
        monkeypatch.delenv("SECRET_KEY", raising=False)
    else:
        monkeypatch.setenv("SECRET_KEY", key)
    assert cli.main(["serve"]) == 2
    assert calls == []  # neither migrated nor started
    assert "SECRET_KEY" in capsys.readouterr().err


def test_serve_in_development_mode_runs_without_a_secret_key(calls, monkeypatch) -> None:
    monkeypatch.delenv("SECRET_KEY", raising=False)
    monkeypatch.delenv("GPUFLEX_DEV", raising=False)
    assert cli.main(["serve", "--dev"]) == 0
    assert calls[-1][1]["env"]["GPUFLEX_DEV"] == "1"
    calls.clear()
    monkeypatch.setenv("GPUFLEX_DEV", "1")
    assert cli.main(["serve"]) == 0 and len(calls) == 2


def test_manage_outside_a_data_folder_says_where_and_creates_nothing(tmp_path) -> None:
    """#37 item 9: `gpuflex manage reconcile` run in the clone created an empty `.gpuflex/`
    and failed with `OperationalError: no such table: ledger_entry`."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "GPUFLEX_DATA_DIR")}  # fmt: skip
    command = [sys.executable, "-m", "marketplace.cli", "manage", "reconcile"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert f"no marketplace database in {tmp_path / '.gpuflex'}" in run.stderr
    assert "GPUFLEX_DATA_DIR=.gpuflex-demo/server" in run.stderr
    assert not (tmp_path / ".gpuflex").exists()


def test_demo_serve_says_how_to_point_the_cli_at_it() -> None:
    from marketplace.demo.accounts import Login
    from marketplace.demo.run import serve_lines

    people = [Login("operator", "operator", "gfx_u_op"), Login("buyer", "buyer", "gfx_u_buy")]
    text = "\n".join(serve_lines("http://127.0.0.1:8123", people, "pw"))
    assert "export GPUFLEX_SERVER=http://127.0.0.1:8123 GPUFLEX_API_KEY=gfx_u_buy" in text
    assert "log in as buyer" in text and "http://127.0.0.1:8123/api/v1/docs/" in text


def test_the_demos_line_names_the_jobs_own_time() -> None:
    """#37 item 11: "completed after 5 rounds in 102.1 s" was the whole demo's run time."""
    from marketplace.demo.summary import print_summary

    summary = {
        "job_id": "j", "status": "completed", "rounds": 5, "wall_s": 102.1,
        "submit_to_end_s": 26.0, "accuracy_per_round": [0.9], "nodes": [],
        "bytes_up_per_node": {}, "bytes_down_per_node": {}, "utilization": None,
        "verified_contributions": 0, "buyer_budget": "1", "buyer_cost": "0",
        "redundancy_cost": "0", "quality_bonus": "0", "buyer_refund": "1",
        "provider_earnings_total": "0", "platform_fee": "0", "ledger_balanced": True,
        "ledger_problems": [], "provenance_verified": True, "model_path": "m",
        "model_hash": "0" * 64,
    }  # fmt: skip
    lines: list[str] = []
    print_summary(summary, lines.append)
    assert "job j: completed after 5 rounds in 26.0 s from submission" in lines[1]
    assert "the demo ran 102.1 s, start-up included" in lines[1]


def test_a_request_does_not_carry_the_process_environment(tmp_path) -> None:
    """granian puts os.environ in every request's environ; Django's request.META (and any
    error report of it) must not show SECRET_KEY or DATABASE_URL. Run in a child process:
    importing the WSGI module freezes the collector for the rest of the process."""
    script = """
import io, os, sys
from marketplace.server.wsgi import application
environ = dict(os.environ) | {
    "REQUEST_METHOD": "GET", "PATH_INFO": "/healthz", "QUERY_STRING": "", "SCRIPT_NAME": "",
    "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
    "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1", "wsgi.input": io.BytesIO(),
    "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
}
status = []
body = b"".join(application(environ, lambda s, h, e=None: status.append(s)))
print(status[0], "SECRET_KEY" in environ, "GPUFLEX_DATA_DIR" in environ, environ["PATH_INFO"])
"""
    env = os.environ | {"SECRET_KEY": secrets.token_urlsafe(50), "GPUFLEX_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["200", "OK", "False", "False", "/healthz"]
