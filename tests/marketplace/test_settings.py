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
        DATABASE_URL="postgres://gpuflex@db.example/gpuflex",
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


# -- #20 finding 7 -----------------------------------------------------------------------------

PUBLIC_KEY = "gpuflex-development-key-not-for-production-use-0000"
PROD = "marketplace.server.settings.production"
POSTGRES = "postgres://gpuflex@db.example/gpuflex"


def read_settings(settings: str, tmp_path: Path, names: str, **env: str) -> list[str]:
    """`repr` of each named setting, from a fresh process with only `env` configured."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "GPUFLEX_TRUSTED_PROXIES", "GPUFLEX_DEV"}
    }
    code = (
        "from django.conf import settings as s; "
        f"[print(repr(getattr(s, n, None))) for n in {names.split()!r}]"
    )
    environment = clean | {"DJANGO_SETTINGS_MODULE": settings, "GPUFLEX_DATA_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env=environment | env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_base_settings_never_fall_back_to_a_public_key(tmp_path: Path) -> None:
    """Without SECRET_KEY the base settings used a constant printed in this repository."""
    (first,) = read_settings("marketplace.server.settings.base", tmp_path, "SECRET_KEY")
    (again,) = read_settings("marketplace.server.settings.base", tmp_path, "SECRET_KEY")
    assert PUBLIC_KEY not in first and len(first) >= 52  # quoted
    assert again == first  # kept in the data dir: sessions outlive a restart
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    (other,) = read_settings("marketplace.server.settings.base", tmp_path / "b", "SECRET_KEY")
    assert other != first


def test_production_refuses_the_public_development_key(tmp_path: Path) -> None:
    out = run_check(PROD, tmp_path, SECRET_KEY=PUBLIC_KEY, DATABASE_URL=POSTGRES)
    assert out.returncode != 0 and "public development key" in out.stderr


def test_production_refuses_sqlite_unless_told(tmp_path: Path) -> None:
    """Production silently fell back to SQLite when DATABASE_URL was unset."""
    out = run_check(PROD, tmp_path, SECRET_KEY=secrets.token_urlsafe(64))
    assert out.returncode != 0 and "DATABASE_URL" in out.stderr
    (engine,) = read_settings(
        PROD, tmp_path, "DATABASES", SECRET_KEY=secrets.token_urlsafe(64), GPUFLEX_ALLOW_SQLITE="1"
    )
    assert "sqlite3" in engine


def test_production_trusts_forwarded_headers_only_when_configured(tmp_path: Path) -> None:
    """Production believed any client's X-Forwarded-Proto; the CSRF cookie was readable by
    scripts."""
    env = {"SECRET_KEY": secrets.token_urlsafe(64), "DATABASE_URL": POSTGRES}
    names = "SECURE_PROXY_SSL_HEADER CSRF_COOKIE_HTTPONLY REST_FRAMEWORK"
    header, httponly, drf = read_settings(PROD, tmp_path, names, **env)
    assert header == "None" and httponly == "True" and "'NUM_PROXIES': 0" in drf
    header, _, drf = read_settings(PROD, tmp_path, names, **env, GPUFLEX_TRUSTED_PROXIES="1")
    assert header == "('HTTP_X_FORWARDED_PROTO', 'https')" and "'NUM_PROXIES': 1" in drf
