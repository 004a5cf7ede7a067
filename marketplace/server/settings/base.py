"""Settings read from the environment.

With nothing set this is the embedded setup `make demo` uses: SQLite and kombu's filesystem
broker under the data dir, and a random SECRET_KEY generated once per data dir (`gpuflex
serve` runs on that only in development mode, GPUFLEX_DEV=1 or --dev). Production sets
DATABASE_URL, CELERY_BROKER_URL, SECRET_KEY, ALLOWED_HOSTS, GPUFLEX_TRUSTED_PROXIES behind a
reverse proxy, and optionally GPUFLEX_STORAGE=s3.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url

from marketplace.server.routing import default_queue
from marketplace.server.secret_key import for_data_dir
from marketplace.server.settings.environment import read
from marketplace.server.settings.observability import (  # noqa: F401
    GPUFLEX_METRICS_TOKEN,
    LOG_FORMAT,
    LOG_FORMATTER,
    OBSERVABILITY_MIDDLEWARE,
)

# Every variable below is declared, typed and bounded once in environment.py (documented in
# docs/settings.md from there); a bad value stops the import here with SettingsError naming
# each one, and `gpuflex serve`/`worker`/`manage` check the same before they start anything.
_env: dict[str, Any] = read()


DATA_DIR = Path(_env["GPUFLEX_DATA_DIR"] or Path.cwd() / ".gpuflex").resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)  # SQLite, media and the broker live here

# Never a constant anyone knows: without SECRET_KEY, this data dir's own generated key.
# `gpuflex serve` refuses that (and any weak key) outside development mode, so several web
# servers never sign with different keys; production.py refuses to start without a real one.
SECRET_KEY = _env["SECRET_KEY"] or for_data_dir(DATA_DIR)
DEBUG = _env["DEBUG"]
ALLOWED_HOSTS = [host.strip() for host in _env["ALLOWED_HOSTS"].split(",") if host.strip()]

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
    "marketplace.proofs",
    "marketplace.sweeps",
    "marketplace.api",
    "marketplace.web",
    "marketplace.observability",
]

MIDDLEWARE = [
    # first: the id is on every log line, including those of the middleware below
    "marketplace.server.request_id.RequestIdMiddleware",
    *OBSERVABILITY_MIDDLEWARE,
    # a plain heartbeat and a plain claim (the most frequent requests) answered here, with
    # the site's rules below applied to them, not the whole chain (api/lean_path.py)
    "marketplace.api.lean_path.LeanAgentMiddleware",
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
TRUSTED_PROXIES = _env["GPUFLEX_TRUSTED_PROXIES"]
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
        _env["DATABASE_URL"] or f"sqlite:///{DATA_DIR / 'gpuflex.sqlite3'}",
        conn_max_age=_env["CONN_MAX_AGE"],
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Long polls and uploads from several threads: wait for the write lock, do not fail;
    # IMMEDIATE takes it at BEGIN, so a read-then-write transaction never deadlocks.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    )
    DATABASES["default"]["CONN_MAX_AGE"] = 0
elif _env["GPUFLEX_DB_PREPARE"]:
    # Django turns psycopg's prepared statements off (None); the claim's cursors prepare
    # theirs explicitly (server/prepared.py) and nothing else is prepared on its own
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 2**31 - 1
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = _env["REDIS_URL"]
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

if _env["GPUFLEX_STORAGE"] == "s3":
    _default_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": _env["AWS_STORAGE_BUCKET_NAME"],
            "endpoint_url": _env["AWS_S3_ENDPOINT_URL"] or None,
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
    "HEARTBEAT_INTERVAL_S": _env["GPUFLEX_HEARTBEAT_INTERVAL_S"],
    # a node silent this long is offline and its leased work goes back to the queue
    "NODE_TIMEOUT_S": _env["GPUFLEX_NODE_TIMEOUT_S"],
    "LEASE_TIMEOUT_S": _env["GPUFLEX_LEASE_TIMEOUT_S"],
    "ROUND_DEADLINE_S": _env["GPUFLEX_ROUND_DEADLINE_S"],
    "MAX_CLAIM_WAIT_S": 30.0,
    # live pushes (marketplace/events/stream.py): each open stream holds a server thread, so
    # a process keeps at most this many and answers 503 (poll instead) beyond
    "EVENT_STREAMS_PER_PROCESS": _env["GPUFLEX_EVENT_STREAMS_PER_PROCESS"],
    "EVENT_KEEPALIVE_S": 15.0,
    "EVENT_STREAM_MAX_S": _env["GPUFLEX_EVENT_STREAM_MAX_S"],
    "DEFAULT_SHARDS": _env["GPUFLEX_DEFAULT_SHARDS"],
    "MAX_DATASET_BYTES": _env["GPUFLEX_MAX_DATASET_BYTES"],
    # a buyer's tokenizer.json and Hugging Face config are read and built by the worker that
    # prepares the job, in a child process with this much address space (interpreter and
    # libraries included; a model's build gets 3x its bytes more) and this long
    # (marketplace/jobs/isolation.py): a panic, abort or runaway kills the child alone
    "ISOLATED_MEMORY_MB": _env["GPUFLEX_ISOLATED_MEMORY_MB"],
    "ISOLATED_SECONDS": _env["GPUFLEX_ISOLATED_SECONDS"],
    # what one uploaded image archive may hold (trainer.datasets.ArchiveLimits): members,
    # bytes decompressed, a member's decompressed / packed ratio, pixels per image, and the
    # float32 tensor its images become on the server
    "IMAGE_ARCHIVE": {
        "max_members": _env["GPUFLEX_ARCHIVE_MAX_MEMBERS"],
        "max_total_bytes": _env["GPUFLEX_ARCHIVE_MAX_BYTES"],
        "max_ratio": _env["GPUFLEX_ARCHIVE_MAX_RATIO"],
        "max_pixels": _env["GPUFLEX_ARCHIVE_MAX_PIXELS"],
        "max_decoded_bytes": _env["GPUFLEX_ARCHIVE_MAX_DECODED"],
    },
    "MAX_UPDATE_BYTES": _env["GPUFLEX_MAX_UPDATE_BYTES"],
    # -- chunked dataset uploads (docs/uploads.md) --
    # open sessions' partial files: on the media folder's filesystem, so that a finished
    # upload moves into storage by a rename; shared by all web servers of a deployment
    "UPLOAD_DIR": _env["GPUFLEX_UPLOAD_DIR"] or str(DATA_DIR / "uploads"),
    "MAX_UPLOAD_BYTES": _env["GPUFLEX_MAX_UPLOAD_BYTES"],
    "MAX_UPLOAD_CHUNK_BYTES": _env["GPUFLEX_MAX_UPLOAD_CHUNK_BYTES"],
    # bytes of open and finished, not yet used, uploads one account may hold
    "UPLOAD_QUOTA_BYTES": _env["GPUFLEX_UPLOAD_QUOTA_BYTES"],
    # an open session without a chunk this long, and a finished upload no job took in
    # UPLOAD_KEEP_S, are removed by the tick with their bytes
    "UPLOAD_STALE_S": _env["GPUFLEX_UPLOAD_STALE_S"],
    "UPLOAD_KEEP_S": _env["GPUFLEX_UPLOAD_KEEP_S"],
    # model size per job (marketplace/jobs/limits.py): the tier's ceiling, scaled down for
    # small budgets at this many parameters per credit, never below the floor
    "MAX_MODEL_PARAMS": {"volunteer": 100_000_000, "hybrid": 500_000_000, "platform": 2 * 10**9},
    "MODEL_PARAMS_PER_CREDIT": _env["GPUFLEX_MODEL_PARAMS_PER_CREDIT"],
    "MODEL_PARAMS_FLOOR": _env["GPUFLEX_MODEL_PARAMS_FLOOR"],
    # BOINC-style adaptive replication: every task of a node with fewer verified results
    # than this is replicated; afterwards only REPLICATION_SHARE of them, at random.
    "TRUST_AFTER_VERIFIED": _env["GPUFLEX_TRUST_AFTER_VERIFIED"],
    "REPLICATION_SHARE": _env["GPUFLEX_REPLICATION_SHARE"],
    # proof-of-learning segment checks (marketplace/proofs): the share of uploads checked, the
    # node's time to reveal the checkpoints and the largest one taken
    "SEGMENT_CHECK_SHARE": _env["GPUFLEX_SEGMENT_CHECK_SHARE"],
    "SEGMENT_PROOF_REQUIRED": _env["GPUFLEX_SEGMENT_PROOF_REQUIRED"],
    "SEGMENT_REVEAL_S": _env["GPUFLEX_SEGMENT_REVEAL_S"],
    "MAX_CHECKPOINT_BYTES": _env["GPUFLEX_MAX_CHECKPOINT_BYTES"],
    # platform nodes (enrolled by an operator) are not replicated until trusted, but this
    # share of their tasks still gets a verification replica (a keyed draw per task)
    "PLATFORM_SPOT_CHECK_RATE": _env["GPUFLEX_PLATFORM_SPOT_CHECK_RATE"],
    # relative L2 distance within which two replicas claiming the same precision agree:
    # trainer.replicas.CROSS_DEVICE_TOLERANCE (measured, see there), since one precision still
    # runs differently on different devices; a fleet of one kind of device may set 1e-3
    "AGREEMENT_TOLERANCE": _env["GPUFLEX_AGREEMENT_TOLERANCE"],
    # an update pointing away from the round's median is dropped (sign-flip / scaling
    # attacks); unset: trainer.rounds.DEFAULT_MIN_COSINE, the simulator's too
    "MIN_COSINE": _env["GPUFLEX_MIN_COSINE"],
    "MIN_RELIABILITY": _env["GPUFLEX_MIN_RELIABILITY"],
    "TICK_S": _env["GPUFLEX_TICK_S"],
    # an aggregating round untouched this long is assumed lost with its worker
    "STUCK_AGGREGATION_S": _env["GPUFLEX_STUCK_AGGREGATION_S"],
    # a job's mlflow_uri must resolve to public addresses (trainer/tracking.py): set this
    # where the tracking server is on the deployment's own network
    "TRACKING_ALLOW_PRIVATE": _env["GPUFLEX_TRACKING_ALLOW_PRIVATE"],
    # an ended job's working files are deleted this long after it ends (rounds/retention.py)
    "ENDED_JOB_FILES_GRACE_S": _env["GPUFLEX_ENDED_JOB_FILES_GRACE_S"],
    # -- money (docs/money.md) --
    "PLATFORM_FEE": _env["GPUFLEX_PLATFORM_FEE"],
    "QUALITY_BONUS_MAX": _env["GPUFLEX_QUALITY_BONUS_MAX"],
    # prices are per reference GPU-hour: a GPU with this fp32 matmul throughput
    "REFERENCE_FP32_TFLOPS": _env["GPUFLEX_REFERENCE_FP32_TFLOPS"],
    # inference is charged per sample: a sample's forward FLOPs at the reference throughput,
    # and never less than this many reference seconds (a row's I/O and bookkeeping)
    "INFERENCE_MIN_S_PER_SAMPLE": _env["GPUFLEX_INFERENCE_MIN_S_PER_SAMPLE"],
    "MIN_SPEED_FACTOR": _env["GPUFLEX_MIN_SPEED_FACTOR"],
    "MAX_SPEED_FACTOR": _env["GPUFLEX_MAX_SPEED_FACTOR"],
    # a node's one speed figure (ledger/speed.py): its benchmark weighs as SPEED_PRIOR_TASKS
    # observed tasks; one more than SPEED_MARGIN times what its tasks show is set aside for
    # what they show, and flagged (losing reliability) after SPEED_FLAG_TASKS tasks
    "SPEED_MARGIN": _env["GPUFLEX_SPEED_MARGIN"],
    "SPEED_PRIOR_TASKS": _env["GPUFLEX_SPEED_PRIOR_TASKS"],
    "SPEED_FLAG_TASKS": _env["GPUFLEX_SPEED_FLAG_TASKS"],
    "MIN_PAYOUT": _env["GPUFLEX_MIN_PAYOUT"],
    # a volunteer's earnings for work no replica checked are not withdrawable this long, and
    # are forfeited (refunded to the buyers) if one of its results fails verification first
    "PAYOUT_HOLD_S": _env["GPUFLEX_PAYOUT_HOLD_S"],
    # a job goes on only while its escrow covers this many times its dearest round so far
    "ROUND_BUDGET_MARGIN": _env["GPUFLEX_ROUND_BUDGET_MARGIN"],
    # -- scale (docs/scale.md) --
    # with REDIS_URL, heartbeats and claims' "seen" marks go to Redis and the tick writes them
    # to the database in one batch (nodes/presence.py); 0 writes each one straight through
    "PRESENCE_IN_REDIS": _env["GPUFLEX_PRESENCE_IN_REDIS"],
    # PostgreSQL: the claim's statements are prepared once per connection (server/prepared.py)
    "DB_PREPARE": _env["GPUFLEX_DB_PREPARE"],
    # with REDIS_URL, API-key lookups are cached this long; a revocation reaches every worker
    # at once (accounts/key_cache.py); 0 looks every key up in the database
    "KEY_CACHE_S": _env["GPUFLEX_KEY_CACHE_S"],
    # the prefix of every key GPUFlex writes to Redis (besides Django's cache and Celery's)
    "REDIS_PREFIX": _env["GPUFLEX_REDIS_PREFIX"],
    # -- accounts --
    # unrevoked user keys one user may hold; revoke one to make another
    "MAX_API_KEYS_PER_USER": _env["GPUFLEX_MAX_API_KEYS_PER_USER"],
}

# -- chain (docs/money.md): "" disabled, "embedded" an in-process EVM (tests, one process),
# else a JSON-RPC URL with CHAIN_DEPLOYMENT (JSON of the addresses) and CHAIN_OPERATOR_KEY.
CHAIN = {
    "URL": _env["GPUFLEX_CHAIN_URL"],
    "DEPLOYMENT": _env["GPUFLEX_CHAIN_DEPLOYMENT"],
    "OPERATOR_KEY": _env["GPUFLEX_CHAIN_OPERATOR_KEY"],
    # token base units per credit: 10**6 for a 6-decimal stablecoin; native: wei per credit
    "UNITS_PER_CREDIT": _env["GPUFLEX_CHAIN_UNITS_PER_CREDIT"],
    "TOKEN": _env["GPUFLEX_CHAIN_TOKEN"],
    # a settlement batch closes when this many verified contributions wait, or when the oldest
    # waiting contribution or payout has waited DEADLINE_S, whichever comes first
    "BATCH_MAX": _env["GPUFLEX_SETTLEMENT_BATCH_MAX"],
    "DEADLINE_S": _env["GPUFLEX_SETTLEMENT_DEADLINE_S"],
}

# Updates arrive as raw request bodies; the view checks the size and answers 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = GPUFLEX["MAX_UPDATE_BYTES"]
FILE_UPLOAD_MAX_MEMORY_SIZE = 4 * 2**20

# -- Celery ----------------------------------------------------------------------------------

CELERY_BROKER_URL = _env["CELERY_BROKER_URL"]
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
CELERY_TASK_ALWAYS_EAGER = _env["CELERY_TASK_ALWAYS_EAGER"]
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
        "schedule": _env["GPUFLEX_SETTLE_S"],
        "options": {"expires": _env["GPUFLEX_SETTLE_S"]},
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
        "key": _env["GPUFLEX_THROTTLE_KEY"],
        "heartbeat": _env["GPUFLEX_THROTTLE_HEARTBEAT"],
        "probe": _env["GPUFLEX_THROTTLE_PROBE"],
        # per client address: unknown or revoked API keys, after which it is refused a while
        "auth_failure": _env["GPUFLEX_THROTTLE_AUTH_FAILURE"],
        # per user
        "submit": _env["GPUFLEX_THROTTLE_SUBMIT"],
        "key_create": _env["GPUFLEX_THROTTLE_KEY_CREATE"],
        # per client address, on the web sign-up page
        "signup": _env["GPUFLEX_THROTTLE_SIGNUP"],
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
AXES_FAILURE_LIMIT = _env["GPUFLEX_LOGIN_FAILURE_LIMIT"]
AXES_COOLOFF_TIME = timedelta(minutes=_env["GPUFLEX_LOGIN_COOLOFF_MIN"])
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
# alone mails them to ADMINS, which is empty. WatchedFileHandler: every web worker appends
# to the one file and reopens it after logrotate moves it.
LOG_FILE = Path(_env["GPUFLEX_LOG_FILE"] or DATA_DIR / "logs" / "marketplace.log")
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
