"""Settings read from the environment.

With nothing set this is the embedded setup `make demo` uses: SQLite and kombu's filesystem
broker under the data dir, and a random SECRET_KEY generated once per data dir (`gpuflex
serve` runs on that only in development mode, GPUFLEX_DEV=1 or --dev). Production sets
DATABASE_URL, CELERY_BROKER_URL, SECRET_KEY, ALLOWED_HOSTS, GPUFLEX_TRUSTED_PROXIES behind a
reverse proxy, and optionally GPUFLEX_STORAGE=s3.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from marketplace.server.routing import default_queue
from marketplace.server.secret_key import for_data_dir
from marketplace.server.settings.observability import (  # noqa: F401
    GPUFLEX_METRICS_TOKEN,
    LOG_FORMAT,
    LOG_FORMATTER,
    OBSERVABILITY_MIDDLEWARE,
)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DATA_DIR = Path(os.environ.get("GPUFLEX_DATA_DIR", Path.cwd() / ".gpuflex")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)  # SQLite, media and the broker live here

# Never a constant anyone knows: without SECRET_KEY, this data dir's own generated key.
# `gpuflex serve` refuses that (and any weak key) outside development mode, so several web
# servers never sign with different keys; production.py refuses to start without a real one.
SECRET_KEY = os.environ.get("SECRET_KEY") or for_data_dir(DATA_DIR)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served locally (SPECTACULAR_SETTINGS)
    "axes",  # web login lockout (AXES_* below)
    "marketplace.accounts",
    "marketplace.nodes",
    "marketplace.jobs",
    "marketplace.rounds",
    "marketplace.ledger",
    "marketplace.uploads",
    "marketplace.sweeps",
    "marketplace.api",
    "marketplace.web",
    "marketplace.observability",
]

MIDDLEWARE = [
    # first: the id is on every log line, including those of the middleware below
    "marketplace.server.request_id.RequestIdMiddleware",
    *OBSERVABILITY_MIDDLEWARE,
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # last, as django-axes asks: turns a locked-out login into its 429 page
    "axes.middleware.AxesMiddleware",
]

# Forwarded headers (X-Forwarded-For, X-Forwarded-Proto) are believed only from this many
# reverse proxies in front of the server, set by the operator; by default nobody's, since
# any client can send them (accounts/client_ip.py, REST_FRAMEWORK's NUM_PROXIES).
TRUSTED_PROXIES = int(os.environ.get("GPUFLEX_TRUSTED_PROXIES", "0"))
if TRUSTED_PROXIES > 0:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# the pages send the CSRF token from their forms (web/static/web/js), never from the cookie
CSRF_COOKIE_HTTPONLY = True

ROOT_URLCONF = "marketplace.server.urls"
WSGI_APPLICATION = "marketplace.server.wsgi.application"
AUTH_USER_MODEL = "accounts.User"
# axes first: it refuses a locked-out login before the password is even checked
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# checked at sign-up (web/forms.py SignupForm)
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 8},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'gpuflex.sqlite3'}"),
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "60")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Long polls and uploads from several threads: wait for the write lock, do not fail;
    # IMMEDIATE takes it at BEGIN, so a read-then-write transaction never deadlocks.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    )
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        # Django's, keeping its Redis client (server/redis_cache.py)
        "default": {"BACKEND": "marketplace.server.redis_cache.RedisCache", "LOCATION": REDIS_URL}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

MEDIA_ROOT = str(DATA_DIR / "media")
STATIC_ROOT = str(DATA_DIR / "static")
STATIC_URL = "static/"

if os.environ.get("GPUFLEX_STORAGE", "filesystem") == "s3":
    _default_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": os.environ.get("AWS_STORAGE_BUCKET_NAME", "gpuflex"),
            "endpoint_url": os.environ.get("AWS_S3_ENDPOINT_URL") or None,
            "default_acl": None,
            "file_overwrite": True,
        },
    }
else:
    _default_storage = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": MEDIA_ROOT},
    }
STORAGES = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# -- GPUFlex ---------------------------------------------------------------------------------

GPUFLEX = {
    "HEARTBEAT_INTERVAL_S": float(os.environ.get("GPUFLEX_HEARTBEAT_INTERVAL_S", "10")),
    # a node silent this long is offline and its leased work goes back to the queue
    "NODE_TIMEOUT_S": float(os.environ.get("GPUFLEX_NODE_TIMEOUT_S", "45")),
    "LEASE_TIMEOUT_S": float(os.environ.get("GPUFLEX_LEASE_TIMEOUT_S", "300")),
    "ROUND_DEADLINE_S": float(os.environ.get("GPUFLEX_ROUND_DEADLINE_S", "900")),
    "MAX_CLAIM_WAIT_S": 30.0,
    # live pushes (marketplace/events/stream.py): each open stream holds a server thread, so
    # a process keeps at most this many and answers 503 (poll instead) beyond
    "EVENT_STREAMS_PER_PROCESS": int(os.environ.get("GPUFLEX_EVENT_STREAMS_PER_PROCESS", "8")),
    "EVENT_KEEPALIVE_S": 15.0,
    "EVENT_STREAM_MAX_S": float(os.environ.get("GPUFLEX_EVENT_STREAM_MAX_S", "300")),
    "DEFAULT_SHARDS": int(os.environ.get("GPUFLEX_DEFAULT_SHARDS", "4")),
    "MAX_DATASET_BYTES": int(os.environ.get("GPUFLEX_MAX_DATASET_BYTES", str(64 * 2**20))),
    # a buyer's tokenizer.json and Hugging Face config are read and built by the worker that
    # prepares the job, in a child process with this much address space (interpreter and
    # libraries included; a model's build gets 3x its bytes more) and this long
    # (marketplace/jobs/isolation.py): a panic, abort or runaway kills the child alone
    "ISOLATED_MEMORY_MB": int(os.environ.get("GPUFLEX_ISOLATED_MEMORY_MB", "4096")),
    "ISOLATED_SECONDS": float(os.environ.get("GPUFLEX_ISOLATED_SECONDS", "600")),
    # what one uploaded image archive may hold (trainer.datasets.ArchiveLimits): members,
    # bytes decompressed, a member's decompressed / packed ratio, pixels per image, and the
    # float32 tensor its images become on the server
    "IMAGE_ARCHIVE": {
        "max_members": int(os.environ.get("GPUFLEX_ARCHIVE_MAX_MEMBERS", "100000")),
        "max_total_bytes": int(os.environ.get("GPUFLEX_ARCHIVE_MAX_BYTES", str(1 << 30))),
        "max_ratio": float(os.environ.get("GPUFLEX_ARCHIVE_MAX_RATIO", "100")),
        "max_pixels": int(os.environ.get("GPUFLEX_ARCHIVE_MAX_PIXELS", str(4096 * 4096))),
        "max_decoded_bytes": int(os.environ.get("GPUFLEX_ARCHIVE_MAX_DECODED", str(2 << 30))),
    },
    "MAX_UPDATE_BYTES": int(os.environ.get("GPUFLEX_MAX_UPDATE_BYTES", str(256 * 2**20))),
    # -- chunked dataset uploads (docs/uploads.md) --
    # open sessions' partial files: on the media folder's filesystem, so that a finished
    # upload moves into storage by a rename; shared by all web servers of a deployment
    "UPLOAD_DIR": os.environ.get("GPUFLEX_UPLOAD_DIR", str(DATA_DIR / "uploads")),
    "MAX_UPLOAD_BYTES": int(os.environ.get("GPUFLEX_MAX_UPLOAD_BYTES", str(8 * 2**30))),
    "MAX_UPLOAD_CHUNK_BYTES": int(
        os.environ.get("GPUFLEX_MAX_UPLOAD_CHUNK_BYTES", str(64 * 2**20))
    ),
    # bytes of open and finished, not yet used, uploads one account may hold
    "UPLOAD_QUOTA_BYTES": int(os.environ.get("GPUFLEX_UPLOAD_QUOTA_BYTES", str(20 * 2**30))),
    # an open session without a chunk this long, and a finished upload no job took in
    # UPLOAD_KEEP_S, are removed by the tick with their bytes
    "UPLOAD_STALE_S": float(os.environ.get("GPUFLEX_UPLOAD_STALE_S", str(24 * 3600))),
    "UPLOAD_KEEP_S": float(os.environ.get("GPUFLEX_UPLOAD_KEEP_S", str(7 * 24 * 3600))),
    # model size per job (marketplace/jobs/limits.py): the tier's ceiling, scaled down for
    # small budgets at this many parameters per credit, never below the floor
    "MAX_MODEL_PARAMS": {"volunteer": 100_000_000, "hybrid": 500_000_000, "platform": 2 * 10**9},
    "MODEL_PARAMS_PER_CREDIT": os.environ.get("GPUFLEX_MODEL_PARAMS_PER_CREDIT", "10000000"),
    "MODEL_PARAMS_FLOOR": int(os.environ.get("GPUFLEX_MODEL_PARAMS_FLOOR", "5000000")),
    # BOINC-style adaptive replication: every task of a node with fewer verified results
    # than this is replicated; afterwards only REPLICATION_SHARE of them, at random.
    "TRUST_AFTER_VERIFIED": int(os.environ.get("GPUFLEX_TRUST_AFTER_VERIFIED", "3")),
    "REPLICATION_SHARE": float(os.environ.get("GPUFLEX_REPLICATION_SHARE", "0.1")),
    # platform nodes (enrolled by an operator) are not replicated until trusted, but this
    # share of their tasks still gets a verification replica (a keyed draw per task)
    "PLATFORM_SPOT_CHECK_RATE": float(os.environ.get("GPUFLEX_PLATFORM_SPOT_CHECK_RATE", "0.05")),
    # relative L2 distance within which two replicas claiming the same precision agree:
    # trainer.replicas.CROSS_DEVICE_TOLERANCE (measured, see there), since one precision still
    # runs differently on different devices; a fleet of one kind of device may set 1e-3
    "AGREEMENT_TOLERANCE": float(os.environ.get("GPUFLEX_AGREEMENT_TOLERANCE", "0.25")),
    # an update pointing away from the round's median is dropped (sign-flip / scaling
    # attacks); unset: trainer.rounds.DEFAULT_MIN_COSINE, the simulator's too
    "MIN_COSINE": os.environ.get("GPUFLEX_MIN_COSINE"),
    "MIN_RELIABILITY": float(os.environ.get("GPUFLEX_MIN_RELIABILITY", "0.2")),
    "TICK_S": float(os.environ.get("GPUFLEX_TICK_S", "5")),
    # an aggregating round untouched this long is assumed lost with its worker
    "STUCK_AGGREGATION_S": float(os.environ.get("GPUFLEX_STUCK_AGGREGATION_S", "120")),
    # a job's mlflow_uri must resolve to public addresses (trainer/tracking.py): set this
    # where the tracking server is on the deployment's own network
    "TRACKING_ALLOW_PRIVATE": os.environ.get("GPUFLEX_TRACKING_ALLOW_PRIVATE", "") == "1",
    # an ended job's working files are deleted this long after it ends (rounds/retention.py)
    "ENDED_JOB_FILES_GRACE_S": float(os.environ.get("GPUFLEX_ENDED_JOB_FILES_GRACE_S", "300")),
    # -- money (docs/money.md) --
    "PLATFORM_FEE": os.environ.get("GPUFLEX_PLATFORM_FEE", "0.10"),
    "QUALITY_BONUS_MAX": os.environ.get("GPUFLEX_QUALITY_BONUS_MAX", "0.10"),
    # prices are per reference GPU-hour: a GPU with this fp32 matmul throughput
    "REFERENCE_FP32_TFLOPS": float(os.environ.get("GPUFLEX_REFERENCE_FP32_TFLOPS", "20")),
    # inference is charged per sample: a sample's forward FLOPs at the reference throughput,
    # and never less than this many reference seconds (a row's I/O and bookkeeping)
    "INFERENCE_MIN_S_PER_SAMPLE": float(
        os.environ.get("GPUFLEX_INFERENCE_MIN_S_PER_SAMPLE", "0.0001")
    ),
    "MIN_SPEED_FACTOR": float(os.environ.get("GPUFLEX_MIN_SPEED_FACTOR", "0.01")),
    "MAX_SPEED_FACTOR": float(os.environ.get("GPUFLEX_MAX_SPEED_FACTOR", "8")),
    # a node whose benchmark is more than this many times what its tasks show is billed at
    # what they show, and loses reliability (ledger/speed.py)
    "SPEED_MARGIN": float(os.environ.get("GPUFLEX_SPEED_MARGIN", "2")),
    "MIN_PAYOUT": os.environ.get("GPUFLEX_MIN_PAYOUT", "5"),
    # a job goes on only while its escrow covers this many times its dearest round so far
    "ROUND_BUDGET_MARGIN": os.environ.get("GPUFLEX_ROUND_BUDGET_MARGIN", "1.5"),
    # -- scale (docs/scale.md) --
    # with REDIS_URL, heartbeats and claims' "seen" marks go to Redis and the tick writes them
    # to the database in one batch (nodes/presence.py); 0 writes each one straight through
    "PRESENCE_IN_REDIS": env_bool("GPUFLEX_PRESENCE_IN_REDIS", True),
    # with REDIS_URL, API-key lookups are cached this long; a revocation reaches every worker
    # at once (accounts/key_cache.py); 0 looks every key up in the database
    "KEY_CACHE_S": float(os.environ.get("GPUFLEX_KEY_CACHE_S", "300")),
    # the prefix of every key GPUFlex writes to Redis (besides Django's cache and Celery's)
    "REDIS_PREFIX": os.environ.get("GPUFLEX_REDIS_PREFIX", "gpuflex"),
    # -- accounts --
    # unrevoked user keys one user may hold; revoke one to make another
    "MAX_API_KEYS_PER_USER": int(os.environ.get("GPUFLEX_MAX_API_KEYS_PER_USER", "50")),
}

# -- chain (docs/money.md): "" disabled, "embedded" an in-process EVM (tests, one process),
# else a JSON-RPC URL with CHAIN_DEPLOYMENT (JSON of the addresses) and CHAIN_OPERATOR_KEY.
CHAIN = {
    "URL": os.environ.get("GPUFLEX_CHAIN_URL", ""),
    "DEPLOYMENT": os.environ.get("GPUFLEX_CHAIN_DEPLOYMENT", ""),
    "OPERATOR_KEY": os.environ.get("GPUFLEX_CHAIN_OPERATOR_KEY", ""),
    # token base units per credit: 10**6 for a 6-decimal stablecoin; native: wei per credit
    "UNITS_PER_CREDIT": int(os.environ.get("GPUFLEX_CHAIN_UNITS_PER_CREDIT", str(10**12))),
    "TOKEN": os.environ.get("GPUFLEX_CHAIN_TOKEN", "0x0000000000000000000000000000000000000000"),
    # a settlement batch closes when this many verified contributions wait, or when the oldest
    # waiting contribution or payout has waited DEADLINE_S, whichever comes first
    "BATCH_MAX": int(os.environ.get("GPUFLEX_SETTLEMENT_BATCH_MAX", "1000")),
    "DEADLINE_S": float(os.environ.get("GPUFLEX_SETTLEMENT_DEADLINE_S", "30")),
}

# Updates arrive as raw request bodies; the view checks the size and answers 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = GPUFLEX["MAX_UPDATE_BYTES"]
FILE_UPLOAD_MAX_MEMORY_SIZE = 4 * 2**20

# -- Celery ----------------------------------------------------------------------------------

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = DATA_DIR / "broker"
    for _folder in ("queue", "processed", "control"):  # kombu expects them to exist
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport, publishing atomically (see broker.py)
    CELERY_BROKER_TRANSPORT = "marketplace.server.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # broadcast (pidbox) exchanges; kombu's default is ./control in the working directory
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # an empty queue is listed again after this long (kombu's default 1 s was most of
        # the wait between a round's quorum and its aggregation)
        "polling_interval": 0.1,
    }
CELERY_TASK_DEFAULT_QUEUE = default_queue()
# aggregation on a queue of its own (server/routing.py): `gpuflex worker --queues`
CELERY_TASK_ROUTES = ("marketplace.server.routing.route_task",)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BEAT_SCHEDULE = {
    # a tick not started within its own period is dropped: the next one does its work, and a
    # backlog of ticks would queue a round's aggregation behind them (the round-phase bench
    # saw ten waiting with a 1 s tick on the embedded broker)
    # the task keeps the name it had in marketplace.jobs (marketplace.rounds.tasks)
    "gpuflex-tick": {
        "task": "marketplace.jobs.tasks.tick",
        "schedule": GPUFLEX["TICK_S"],
        "options": {"expires": GPUFLEX["TICK_S"]},
    },
}
if CHAIN["URL"]:
    CELERY_BEAT_SCHEDULE["gpuflex-settle-chain"] = {
        "task": "marketplace.ledger.tasks.settle_chain",
        # how often the deadline is checked: a batch closes at most this long after it is due
        "schedule": float(os.environ.get("GPUFLEX_SETTLE_S", "5")),
        "options": {"expires": float(os.environ.get("GPUFLEX_SETTLE_S", "5"))},
    }
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

# -- REST API --------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["marketplace.accounts.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies nested deeper than trainer.nesting.MAX_DEPTH are a 400
    "DEFAULT_PARSER_CLASSES": [
        "marketplace.api.parsers.DepthLimitedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "marketplace.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    # documents the error envelope and the 4xx answers every operation can give
    "DEFAULT_SCHEMA_CLASS": "marketplace.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "marketplace.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["marketplace.api.throttles.KeyRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "key": os.environ.get("GPUFLEX_THROTTLE_KEY", "6000/min"),
        "heartbeat": os.environ.get("GPUFLEX_THROTTLE_HEARTBEAT", "120/min"),
        "probe": os.environ.get("GPUFLEX_THROTTLE_PROBE", "60/hour"),
        # per client address: unknown or revoked API keys, after which it is refused a while
        "auth_failure": os.environ.get("GPUFLEX_THROTTLE_AUTH_FAILURE", "30/min"),
        # per user
        "submit": os.environ.get("GPUFLEX_THROTTLE_SUBMIT", "120/hour"),
        "key_create": os.environ.get("GPUFLEX_THROTTLE_KEY_CREATE", "30/hour"),
        # per client address, on the web sign-up page
        "signup": os.environ.get("GPUFLEX_THROTTLE_SIGNUP", "10/hour"),
    },
    # the client address is X-Forwarded-For's entry this many proxies back, else REMOTE_ADDR
    "NUM_PROXIES": TRUSTED_PROXIES,
    "UNAUTHENTICATED_USER": None,
}

# -- web login lockout (django-axes) ---------------------------------------------------------

# this many wrong passwords for one name from one address lock that pair out for the cool-off,
# right password or not (attempts are kept in the database, shared by every worker). By the
# pair, not the name alone, so that nobody can lock another user out from elsewhere; and a
# success resets only its own pair, so logging into one's own account resets nothing else.
AXES_FAILURE_LIMIT = int(os.environ.get("GPUFLEX_LOGIN_FAILURE_LIMIT", "10"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("GPUFLEX_LOGIN_COOLOFF_MIN", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "marketplace.accounts.client_ip.client_ip"
AXES_LOCKOUT_CALLABLE = "marketplace.web.views.public.locked_out"
AXES_VERBOSE = False

SPECTACULAR_SETTINGS = {
    "TITLE": "GPUFlex marketplace API",
    "DESCRIPTION": "Jobs, nodes and tasks; the agent contract is docs/agent-api.md.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # Swagger UI's and ReDoc's scripts from the server itself (drf-spectacular-sidecar's
    # static files), not a CDN: /api/v1/docs/ works offline and behind a strict firewall
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "NodeStateEnum": "marketplace.nodes.models.NodeState",
        "JobStatusEnum": "marketplace.jobs.models.JobStatus",
        "RoundStatusEnum": "marketplace.rounds.models.RoundStatus",
        "HeartbeatStateEnum": ["idle", "working", "paused", "waiting"],
        "ModelSourceKindEnum": ["full", "seed", "delta"],
        "NodeKindEnum": "marketplace.nodes.models.NodeKind",
    },
}

# Errors reach stderr and a file, each line carrying its request's id (request_id.py); Django
# alone mails them to ADMINS, which is empty. WatchedFileHandler: every gunicorn worker appends
# to the one file and reopens it after logrotate moves it.
LOG_FILE = Path(os.environ.get("GPUFLEX_LOG_FILE", DATA_DIR / "logs" / "marketplace.log"))
LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "marketplace.server.request_id.RequestIdFilter"}},
    "formatters": {"line": LOG_FORMATTER},  # GPUFLEX_LOG_FORMAT=json: settings/observability
    "handlers": {
        "console": {
            "class": "marketplace.server.request_id.StderrHandler",
            "filters": ["request_id"],
            "formatter": "line",
        },
        "file": {
            "class": "logging.handlers.WatchedFileHandler",
            "filename": str(LOG_FILE),
            "filters": ["request_id"],
            "formatter": "line",
        },
    },
    "loggers": {
        "marketplace": {"handlers": ["console", "file"], "level": "INFO"},
        # django.request: 5xx with their tracebacks, 4xx as warnings
        "django": {"handlers": ["console", "file"], "level": "WARNING"},
    },
}
