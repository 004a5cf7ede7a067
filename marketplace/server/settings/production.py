"""Production: everything from the environment, HTTPS only; passes `check --deploy`."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from marketplace.server.secret_key import MIN_LENGTH, weakness
from marketplace.server.settings.base import *  # noqa: F403
from marketplace.server.settings.base import DATABASES, _env

SECRET_KEY = _env["SECRET_KEY"] or ""
if (_weak := weakness(SECRET_KEY)) is not None:
    raise ImproperlyConfigured(
        f"production needs SECRET_KEY of at least {MIN_LENGTH} random characters; it {_weak}"
    )
DEBUG = False

# SQLite is the embedded demo's database: production says it means it, or sets DATABASE_URL
if DATABASES["default"]["ENGINE"].endswith("sqlite3") and not _env["GPUFLEX_ALLOW_SQLITE"]:
    raise ImproperlyConfigured(
        "production needs DATABASE_URL (PostgreSQL); set GPUFLEX_ALLOW_SQLITE=1 to run on "
        "SQLite deliberately"
    )

# X-Forwarded-Proto is believed only with GPUFLEX_TRUSTED_PROXIES set (base.py): behind a
# TLS-terminating proxy set it, or SECURE_SSL_REDIRECT would redirect every request forever
SECURE_SSL_REDIRECT = _env["SECURE_SSL_REDIRECT"]
SECURE_HSTS_SECONDS = _env["SECURE_HSTS_SECONDS"]
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
CSRF_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
