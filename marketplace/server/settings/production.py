"""Production: everything from the environment, HTTPS only; passes `check --deploy`."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from marketplace.server.settings.base import *  # noqa: F403
from marketplace.server.settings.base import env_bool

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("production needs SECRET_KEY of at least 50 random characters")
DEBUG = False

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
