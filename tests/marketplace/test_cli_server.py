"""`gpuflex serve`, `worker` and `manage` start the right programs with the right settings."""

from __future__ import annotations

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


def test_serve_migrates_then_runs_gunicorn_threads(calls) -> None:
    assert cli.main(["serve", "--bind", "0.0.0.0:9000", "--workers", "3"]) == 0
    (migrate, _), (serve, kwargs) = calls
    assert migrate[-4:] == ["migrate", "--noinput", "-v", "0"]
    assert serve[0].endswith("gunicorn") and "marketplace.server.wsgi:application" in serve
    assert serve[serve.index("--bind") + 1] == "0.0.0.0:9000"
    assert serve[serve.index("--workers") + 1] == "3"
    assert serve[serve.index("--worker-class") + 1] == "gthread"
    assert kwargs["env"]["DJANGO_SETTINGS_MODULE"]


def test_worker_runs_celery_with_beat(calls) -> None:
    assert cli.main(["worker"]) == 0
    ((cmd, _),) = calls
    assert cmd[0].endswith("celery") and "marketplace.server.celery" in cmd
    assert "--beat-thread" in cmd and cmd[cmd.index("--pool") + 1] == "prefork"
    calls.clear()
    cli.main(["worker", "--no-beat", "--pool", "solo"])
    assert "--beat-thread" not in calls[0][0] and "solo" in calls[0][0]


def test_manage_passes_through(db, capsys) -> None:
    assert cli.main(["manage", "check"]) == 0
    assert "no issues" in capsys.readouterr().out
