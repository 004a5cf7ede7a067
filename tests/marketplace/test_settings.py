"""Production settings pass Django's deployment checks; the embedded default needs nothing."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def run_check(settings: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY"}}
    environment = clean | {"DJANGO_SETTINGS_MODULE": settings, "GPUFLEX_DATA_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "django", "check", *args],
        env=environment | env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_production_settings_pass_check_deploy(tmp_path: Path) -> None:
    out = run_check(
        "marketplace.server.settings.production",
        tmp_path,
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="gpuflex.example",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_production_refuses_a_missing_secret_key(tmp_path: Path) -> None:
    out = run_check("marketplace.server.settings.production", tmp_path)
    assert out.returncode != 0 and "SECRET_KEY" in out.stderr


def test_embedded_default_is_sqlite_under_the_data_dir(tmp_path: Path) -> None:
    code = (
        "from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.MEDIA_ROOT)"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env |= {
        "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
        "GPUFLEX_DATA_DIR": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    engine, broker, media = out.stdout.split()
    assert engine.endswith("sqlite3") and broker == "filesystem://"
    assert media.startswith(str(tmp_path))
