"""Every environment variable the server reads, declared once: name, type, default, bounds and
what it does (issue 36).

`base.py` and `production.py` take their values from `read()`, `gpuflex serve`/`worker`/
`beat`/`manage` call `check()` before Django or the web server imports anything, and
docs/settings.md's table is generated from `TABLE` (`gpuflex settings --markdown`;
tests/marketplace/test_settings_environment.py keeps it current). A bad value is refused with
its variable, what it got and what it wants, every bad one at once, never a bare ValueError at
import.

This module imports neither Django nor anything heavy: the CLI validates with it before it
starts a server process. The values are checked by pydantic (already a dependency) through a
model built from the table, so the table is the only declaration.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

# the defaults the simulator assumes too (failure detection, the tick, a round's deadline)
from trainer import round_lifecycle as rl

Kind = Literal["int", "float", "bool", "decimal", "text", "path", "url", "list", "rate", "choice"]
KIB, MIB, GIB = 2**10, 2**20, 2**30
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
# DRF's rates: a count, then per second/minute/hour/day (only the period's first letter counts)
RATE = re.compile(r"^\d+/(s|sec|second|m|min|minute|h|hour|d|day)$")


class SettingsError(Exception):
    """The environment holds values the server cannot run on; str() lists every one, a line
    each, `NAME: got 'VALUE', wants ...`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Setting:
    """One environment variable. `default` is the value used when it is unset or empty (None:
    computed from other settings, `shown` says how); bounds apply to numbers."""

    env: str
    kind: Kind
    default: Any
    what: str
    section: str
    unit: str = ""  # "seconds", "bytes", ...: in the refusal and the documentation
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    shown: str = ""  # the default as the documentation shows it, where not str(default)
    secret: bool = False  # never echoed back in a refusal

    def wants(self) -> str:
        """What a good value looks like, for the refusal and the table."""
        unit = f" of {self.unit}" if self.unit else ""
        base = {
            "int": f"a whole number{unit}",
            "float": f"a number{unit}",
            "decimal": f"a decimal number{unit}",
            "bool": "1 or 0 (true/false, yes/no, on/off)",
            "text": "text",
            "path": "a file system path",
            "url": "a URL",
            "list": "a comma-separated list",
            "rate": "a rate N/sec, N/min, N/hour or N/day, like 120/min",
            "choice": " or ".join(repr(c) for c in self.choices),
        }[self.kind]
        return base + self._bounds()

    def _bounds(self) -> str:
        low = f" > {_num(self.gt)}" if self.gt is not None else ""
        low = f" >= {_num(self.ge)}" if self.ge is not None else low
        high = f" < {_num(self.lt)}" if self.lt is not None else ""
        high = f" <= {_num(self.le)}" if self.le is not None else high
        if low and high:
            return f"{low} and{high}"
        return low or high

    def default_text(self) -> str:
        if self.shown:
            return self.shown
        if self.kind == "bool":
            return "1" if self.default else "0"
        if self.default is None:
            return "unset"
        if self.unit == "bytes" and self.default % MIB == 0:
            size = self.default // MIB
            return (
                f"{self.default} ({size // 1024} GiB)"
                if size % 1024 == 0
                else (f"{self.default} ({size} MiB)")
            )
        return str(self.default)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _s(
    env: str,
    kind: Kind,
    default: Any,
    what: str,
    section: str,
    **more: Any,
) -> Setting:
    return Setting(env=env, kind=kind, default=default, what=what, section=section, **more)


SERVER, DATA, LIMITS, SCHEDULE, TRUST, MONEY, CHAIN, SCALE, THROTTLE, OBSERVABILITY = (
    "Server",
    "Data, storage and queues",
    "Sizes and limits",
    "Timing",
    "Verification and trust",
    "Money",
    "Chain settlement",
    "Scale (Redis)",
    "Throttles and lockout",
    "Observability",
)
PRODUCTION = "Production (production.py only)"

TABLE: tuple[Setting, ...] = (
    # -- server --
    _s("GPUFLEX_DATA_DIR", "path", None, "the data folder: SQLite, media, the embedded broker, "
       "the generated secret key, logs", SERVER, shown="./.gpuflex"),
    _s("SECRET_KEY", "text", None, "Django's signing key; unset: the data folder's generated "
       "one, which `gpuflex serve` accepts only in development mode", SERVER,
       shown="generated per data folder", secret=True),
    _s("GPUFLEX_DEV", "bool", False, "development mode: `gpuflex serve` runs on the generated "
       "key (same as `--dev`)", SERVER),
    _s("DEBUG", "bool", False, "Django's debug pages; never on a public server", SERVER),
    _s("ALLOWED_HOSTS", "list", "localhost,127.0.0.1,[::1],testserver", "host names the "
       "server answers to", SERVER),
    _s("GPUFLEX_TRUSTED_PROXIES", "int", 0, "reverse proxies in front of the server whose "
       "X-Forwarded-For/-Proto are believed", SERVER, ge=0),
    _s("GPUFLEX_LOG_FILE", "path", None, "the log file every process appends to", SERVER,
       shown="$GPUFLEX_DATA_DIR/logs/marketplace.log"),
    # -- data, storage and queues --
    _s("DATABASE_URL", "url", None, "the database (PostgreSQL in production)", DATA,
       shown="SQLite in the data folder", secret=True),
    _s("CONN_MAX_AGE", "int", 60, "seconds a database connection is kept open (PostgreSQL)",
       DATA, unit="seconds", ge=0),
    _s("REDIS_URL", "url", "", "Redis: the shared cache, presence, key cache, live pushes",
       DATA, shown="unset (per-process memory)", secret=True),
    _s("CELERY_BROKER_URL", "url", "filesystem://", "Celery's broker; `filesystem://` is "
       "the embedded one in the data folder", DATA, secret=True),
    _s("CELERY_TASK_ALWAYS_EAGER", "bool", False, "run Celery tasks in the calling process "
       "(tests)", DATA),
    _s("GPUFLEX_CELERY_QUEUE", "text", "gpuflex", "the Celery queue; aggregation uses "
       "`QUEUE.aggregation`", DATA),
    _s("GPUFLEX_STORAGE", "choice", "filesystem", "where media (datasets, models, updates) "
       "are stored", DATA, choices=("filesystem", "s3")),
    _s("AWS_STORAGE_BUCKET_NAME", "text", "gpuflex", "the S3 bucket (GPUFLEX_STORAGE=s3)",
       DATA),
    _s("AWS_S3_ENDPOINT_URL", "url", "", "an S3-compatible endpoint (MinIO, ...); unset: AWS",
       DATA, shown="unset"),
    _s("GPUFLEX_UPLOAD_DIR", "path", None, "open chunked uploads' partial files, on the "
       "media folder's file system", DATA, shown="$GPUFLEX_DATA_DIR/uploads"),
    # -- sizes and limits --
    _s("GPUFLEX_MAX_DATASET_BYTES", "int", 64 * MIB, "largest dataset inline in a "
       "submission", LIMITS, unit="bytes", gt=0),
    _s("GPUFLEX_ISOLATED_MEMORY_MB", "int", 4096, "address space of the child process in "
       "which the preparing worker reads a buyer's tokenizer and builds an hf_* model "
       "(interpreter and libraries included)", LIMITS, unit="MiB", gt=0),
    _s("GPUFLEX_ISOLATED_SECONDS", "float", 600.0, "wall-clock and CPU time of that child; "
       "past it the child ends and the job fails with the reason", LIMITS, unit="seconds",
       gt=0, shown="600"),
    _s("GPUFLEX_MAX_UPDATE_BYTES", "int", 256 * MIB, "largest model update a node may send",
       LIMITS, unit="bytes", gt=0),
    _s("GPUFLEX_MAX_UPLOAD_BYTES", "int", 8 * GIB, "largest chunked dataset upload", LIMITS,
       unit="bytes", gt=0),
    _s("GPUFLEX_MAX_UPLOAD_CHUNK_BYTES", "int", 64 * MIB, "largest chunk of an upload",
       LIMITS, unit="bytes", gt=0),
    _s("GPUFLEX_UPLOAD_QUOTA_BYTES", "int", 20 * GIB, "open and unused uploads one buyer may "
       "hold", LIMITS, unit="bytes", gt=0),
    _s("GPUFLEX_ARCHIVE_MAX_MEMBERS", "int", 100_000, "files in one uploaded image archive",
       LIMITS, gt=0),
    _s("GPUFLEX_ARCHIVE_MAX_BYTES", "int", 1 << 30, "an image archive's bytes, "
       "decompressed", LIMITS, unit="bytes", gt=0),
    _s("GPUFLEX_ARCHIVE_MAX_RATIO", "float", 100.0, "a member's decompressed/packed size "
       "ratio (zip bombs)", LIMITS, gt=0, shown="100"),
    _s("GPUFLEX_ARCHIVE_MAX_PIXELS", "int", 4096 * 4096, "pixels in one image of an archive",
       LIMITS, gt=0),
    _s("GPUFLEX_ARCHIVE_MAX_DECODED", "int", 2 << 30, "the float32 tensor an archive's "
       "images become on the server", LIMITS, unit="bytes", gt=0),
    _s("GPUFLEX_DEFAULT_SHARDS", "int", 4, "shards of a job whose spec names none", LIMITS,
       ge=1),
    _s("GPUFLEX_MODEL_PARAMS_PER_CREDIT", "decimal", "10000000", "model parameters a job may "
       "have per credit of budget, below the tier's ceiling; 0: the floor only", LIMITS, ge=0),
    _s("GPUFLEX_MODEL_PARAMS_FLOOR", "int", 5_000_000, "model parameters any job may have, "
       "whatever its budget", LIMITS, ge=0),
    _s("GPUFLEX_MAX_API_KEYS_PER_USER", "int", 50, "unrevoked API keys one user may hold",
       LIMITS, ge=1),
    _s("GPUFLEX_EVENT_STREAMS_PER_PROCESS", "int", 8, "live-push streams one web process "
       "holds (a thread each); beyond, 503 and clients poll", LIMITS, ge=0),
    # -- timing --
    _s("GPUFLEX_HEARTBEAT_INTERVAL_S", "float", 10.0, "how often agents are told to "
       "heartbeat", SCHEDULE, unit="seconds", gt=0, shown="10"),
    _s("GPUFLEX_NODE_TIMEOUT_S", "float", rl.NODE_TIMEOUT_S, "a node silent this long is "
       "offline and its leased work goes back to the queue", SCHEDULE, unit="seconds", gt=0,
       shown="45"),
    _s("GPUFLEX_LEASE_TIMEOUT_S", "float", 300.0, "a leased task unfinished this long goes "
       "back to the queue", SCHEDULE, unit="seconds", gt=0, shown="300"),
    _s("GPUFLEX_ROUND_DEADLINE_S", "float", rl.ROUND_DEADLINE_S, "a round's deadline", SCHEDULE,
       unit="seconds", gt=0, shown="900"),
    _s("GPUFLEX_TICK_S", "float", rl.TICK_S, "the periodic tick's period (offline detection, "
       "expiry, presence flush)", SCHEDULE, unit="seconds", gt=0, shown="5"),
    _s("GPUFLEX_STUCK_AGGREGATION_S", "float", 120.0, "an aggregating round untouched this "
       "long, or a received upload's check sent this long ago, is assumed lost with its "
       "worker and sent again", SCHEDULE, unit="seconds", gt=0, shown="120"),
    _s("GPUFLEX_EVENT_STREAM_MAX_S", "float", 300.0, "a live-push stream's lifetime; "
       "clients reconnect", SCHEDULE, unit="seconds", gt=0, shown="300"),
    _s("GPUFLEX_UPLOAD_STALE_S", "float", float(24 * 3600), "an upload session without a "
       "chunk this long is removed", SCHEDULE, unit="seconds", gt=0, shown="86400"),
    _s("GPUFLEX_UPLOAD_KEEP_S", "float", float(7 * 24 * 3600), "a finished upload no job "
       "took this long is removed", SCHEDULE, unit="seconds", gt=0, shown="604800"),
    _s("GPUFLEX_ENDED_JOB_FILES_GRACE_S", "float", 300.0, "an ended job's working files are "
       "deleted this long after it ends", SCHEDULE, unit="seconds", ge=0, shown="300"),
    # -- verification and trust --
    _s("GPUFLEX_TRUST_AFTER_VERIFIED", "int", 3, "verified results after which a node's "
       "tasks are replicated only at REPLICATION_SHARE", TRUST, ge=0),
    _s("GPUFLEX_REPLICATION_SHARE", "float", 0.1, "share of a trusted node's tasks still "
       "replicated", TRUST, ge=0, le=1),
    _s("GPUFLEX_PLATFORM_SPOT_CHECK_RATE", "float", 0.05, "share of platform nodes' tasks "
       "given a verification replica", TRUST, ge=0, le=1),
    # 0.25: a trusted node that starts cheating on every task is caught within 20 tasks with
    # probability 1 - 0.75^20 = 0.997 (issue 35 asks 0.99), at 0.25 x 1/4 of a segment = 6 %
    # of its compute; a node on probation has every upload checked, whatever this says
    _s("GPUFLEX_SEGMENT_CHECK_SHARE", "float", 0.25, "share of a trusted node's training "
       "uploads with a proof of learning whose node is asked to reveal a random segment's "
       "checkpoints, re-run by the worker (marketplace/proofs); such uploads get no replica. "
       "0 turns segment checks off (replicas alone)", TRUST, ge=0, le=1),
    _s("GPUFLEX_SEGMENT_PROOF_REQUIRED", "bool", False, "a drawn training upload without a "
       "proof of learning fails its check (off: agents older than proofs are left to "
       "replicas)", TRUST),
    _s("GPUFLEX_SEGMENT_REVEAL_S", "int", 600, "seconds a node has to reveal a segment check's "
       "checkpoints before the check fails", TRUST, ge=1),
    _s("GPUFLEX_MAX_CHECKPOINT_BYTES", "int", 256 * MIB, "the largest revealed checkpoint "
       "taken (one request body)", TRUST, ge=1),
    _s("GPUFLEX_AGREEMENT_TOLERANCE", "float", 0.25, "relative L2 distance within which two "
       "replicas agree", TRUST, gt=0),
    _s("GPUFLEX_MIN_COSINE", "decimal", None, "an update whose cosine to the round's median is "
       "below this is dropped; below -1 (say -2) the filter is off", TRUST, le=1,
       shown="unset (trainer.rounds.DEFAULT_MIN_COSINE)"),
    _s("GPUFLEX_MIN_RELIABILITY", "float", 0.2, "nodes below this reliability get no work",
       TRUST, ge=0, le=1),
    _s("GPUFLEX_TRACKING_ALLOW_PRIVATE", "bool", False, "let a job's mlflow_uri resolve to "
       "private addresses (a tracking server on the deployment's network)", TRUST),
    # -- money --
    _s("GPUFLEX_PLATFORM_FEE", "decimal", "0.10", "the platform's share of what a job pays",
       MONEY, ge=0, lt=1),
    _s("GPUFLEX_QUALITY_BONUS_MAX", "decimal", "0.10", "the largest quality bonus, a share "
       "of the base pay", MONEY, ge=0),
    _s("GPUFLEX_REFERENCE_FP32_TFLOPS", "float", 20.0, "fp32 throughput of the reference GPU "
       "prices are quoted for", MONEY, unit="TFLOPS", gt=0, shown="20"),
    _s("GPUFLEX_INFERENCE_MIN_S_PER_SAMPLE", "float", 0.0001, "reference seconds an "
       "inference sample is charged at least", MONEY, unit="seconds", ge=0),
    _s("GPUFLEX_MIN_SPEED_FACTOR", "float", 0.01, "slowest speed factor a node is billed "
       "at", MONEY, gt=0),
    _s("GPUFLEX_MAX_SPEED_FACTOR", "float", 8.0, "fastest speed factor a node is billed at",
       MONEY, gt=0, shown="8"),
    _s("GPUFLEX_SPEED_MARGIN", "float", 2.0, "a benchmark more than this many times what "
       "the node's tasks show is set aside for what they show (and flagged)", MONEY, gt=0,
       shown="2"),
    _s("GPUFLEX_SPEED_PRIOR_TASKS", "float", 3.0, "how many observed tasks a node's "
       "benchmark weighs as in its speed figure", MONEY, ge=0, shown="3"),
    _s("GPUFLEX_SPEED_FLAG_TASKS", "int", 20, "observed tasks before a node's benchmark can "
       "be flagged as inflated", MONEY, ge=1),
    _s("GPUFLEX_MIN_PAYOUT", "decimal", "5", "smallest payout a contributor may withdraw",
       MONEY, unit="credits", ge=0),
    # 7 days: a node finishing 2 tasks a day holds 14, more than the 13 past which no share
    # of cheating pays at the default REPLICATION_SHARE even when a task's cost is 3/4 of its
    # pay (6 at 1/2; ledger/cheating_ev.py, docs/money.md); a usual marketplace payout delay
    _s("GPUFLEX_PAYOUT_HOLD_S", "float", float(7 * 24 * 3600), "a volunteer's earnings for "
       "unverified work wait this long before they can be paid out, and are forfeited to the "
       "buyers if one of its results fails verification first; 7 days makes cheating cost "
       "more than it saves (docs/money.md); 0: no hold", MONEY, unit="seconds", ge=0,
       shown="604800"),
    _s("GPUFLEX_ROUND_BUDGET_MARGIN", "decimal", "1.5", "a job goes on while its escrow "
       "covers this many times its dearest round", MONEY, ge=1),
    # -- chain settlement --
    _s("GPUFLEX_CHAIN_URL", "url", "", "settlement chain: unset off, `embedded` an "
       "in-process EVM, else a JSON-RPC URL", CHAIN, shown="unset (off)"),
    _s("GPUFLEX_CHAIN_DEPLOYMENT", "text", "", "the contracts' addresses, JSON", CHAIN,
       shown="unset"),
    _s("GPUFLEX_CHAIN_OPERATOR_KEY", "text", "", "the operator's private key on the chain",
       CHAIN, shown="unset", secret=True),
    _s("GPUFLEX_CHAIN_UNITS_PER_CREDIT", "int", 10**12, "token base units per credit "
       "(10**6 for a 6-decimal stablecoin)", CHAIN, gt=0),
    _s("GPUFLEX_CHAIN_TOKEN", "text", "0x0000000000000000000000000000000000000000",
       "the ERC-20 token paid in; the zero address: the native coin", CHAIN),
    _s("GPUFLEX_SETTLEMENT_BATCH_MAX", "int", 1000, "verified contributions that close a "
       "settlement batch", CHAIN, ge=1),
    # 20 s: with the beat's 5 s look and two transactions, a contribution is then on chain
    # within the 30 s the product promises (`gpuflex demo --chain`: max 26 s; at 30 s, 37 s)
    _s("GPUFLEX_SETTLEMENT_DEADLINE_S", "float", 20.0, "the longest a contribution or "
       "payout waits for its batch", CHAIN, unit="seconds", gt=0, shown="20"),
    _s("GPUFLEX_SETTLE_S", "float", 5.0, "how often the batch deadline is checked", CHAIN,
       unit="seconds", gt=0, shown="5"),
    # -- scale --
    _s("GPUFLEX_PRESENCE_IN_REDIS", "bool", True, "with REDIS_URL, heartbeats go to Redis "
       "and the tick writes them in one batch; 0 writes each through", SCALE),
    _s("GPUFLEX_DB_PREPARE", "bool", True, "PostgreSQL plans a claim's statements once per "
       "connection (server-side prepared); 0 for a pooler that cannot carry them (PgBouncer "
       "before 1.21 in transaction mode)", SCALE),
    _s("GPUFLEX_KEY_CACHE_S", "float", 300.0, "with REDIS_URL, how long API-key lookups are "
       "cached; 0 looks every key up", SCALE, unit="seconds", ge=0, shown="300"),
    _s("GPUFLEX_REDIS_PREFIX", "text", "gpuflex", "prefix of every key GPUFlex writes to "
       "Redis", SCALE),
    # -- throttles and lockout --
    _s("GPUFLEX_THROTTLE_KEY", "rate", "6000/min", "any API request, per API key", THROTTLE),
    _s("GPUFLEX_THROTTLE_HEARTBEAT", "rate", "120/min", "heartbeats, per node key",
       THROTTLE),
    _s("GPUFLEX_THROTTLE_PROBE", "rate", "60/hour", "link probes, per node key", THROTTLE),
    _s("GPUFLEX_THROTTLE_AUTH_FAILURE", "rate", "30/min", "unknown or revoked keys, per "
       "client address", THROTTLE),
    _s("GPUFLEX_THROTTLE_SUBMIT", "rate", "120/hour", "job submissions, per buyer",
       THROTTLE),
    _s("GPUFLEX_THROTTLE_KEY_CREATE", "rate", "30/hour", "new API keys, per user", THROTTLE),
    _s("GPUFLEX_THROTTLE_SIGNUP", "rate", "10/hour", "sign-ups, per client address",
       THROTTLE),
    _s("GPUFLEX_LOGIN_FAILURE_LIMIT", "int", 10, "wrong passwords that lock a name and "
       "address pair out", THROTTLE, ge=1),
    _s("GPUFLEX_LOGIN_COOLOFF_MIN", "float", 15.0, "how long a locked-out pair stays "
       "locked", THROTTLE, unit="minutes", gt=0, shown="15"),
    # -- observability (docs/deploy.md) --
    _s("GPUFLEX_LOG_FORMAT", "choice", "plain", "`json`: one JSON object per log line, with "
       "the request id", OBSERVABILITY, choices=("plain", "json")),
    _s("GPUFLEX_METRICS_TOKEN", "text", "", "a bearer token that lets a scraper read "
       "`/metrics` from anywhere; unset, `/metrics` answers only on loopback with no proxy in "
       "between", OBSERVABILITY, shown="unset", secret=True),
    # -- production --
    _s("GPUFLEX_ALLOW_SQLITE", "bool", False, "run production on SQLite deliberately",
       PRODUCTION),
    _s("SECURE_SSL_REDIRECT", "bool", True, "redirect HTTP to HTTPS", PRODUCTION),
    _s("SECURE_HSTS_SECONDS", "int", 31_536_000, "HSTS max-age", PRODUCTION,
       unit="seconds", ge=0),
)  # fmt: skip

BY_NAME: dict[str, Setting] = {s.env: s for s in TABLE}


# -- checking, through pydantic ----------------------------------------------------------


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError("not a yes/no")


def _rate(text: str) -> str:
    if not RATE.match(text.strip()):
        raise ValueError("not a rate")
    return text.strip()


def _decimal_text(setting: Setting) -> Callable[[str], str]:
    """Money and ratios stay text, as the code that uses them reads them into Decimal itself,
    but must parse as one within the bounds."""

    def check(text: str) -> str:
        try:
            value = Decimal(text.strip())
        except ArithmeticError:  # decimal.InvalidOperation: not a number
            raise ValueError("not a decimal") from None
        if not value.is_finite() or not _within(setting, value):
            raise ValueError("out of bounds")
        return text.strip()

    return check


def _within(setting: Setting, value: Any) -> bool:
    return not (
        (setting.gt is not None and not value > setting.gt)
        or (setting.ge is not None and not value >= setting.ge)
        or (setting.lt is not None and not value < setting.lt)
        or (setting.le is not None and not value <= setting.le)
    )


def _field_type(setting: Setting) -> Any:
    bounds = {k: getattr(setting, k) for k in ("gt", "ge", "lt", "le")}
    bounds = {k: v for k, v in bounds.items() if v is not None}
    if setting.kind == "int":
        return Annotated[int, Field(strict=False, **bounds)]
    if setting.kind == "float":
        return Annotated[float, Field(allow_inf_nan=False, **bounds)]
    if setting.kind == "bool":
        return Annotated[str, AfterValidator(_bool)]
    if setting.kind == "decimal":
        return Annotated[str, AfterValidator(_decimal_text(setting))]
    if setting.kind == "rate":
        return Annotated[str, AfterValidator(_rate)]
    if setting.kind == "choice":
        return Literal[setting.choices]  # type: ignore[valid-type]
    return str


def _model() -> type[BaseModel]:
    fields: dict[str, Any] = {
        s.env: (_field_type(s) | None, Field(default=None, description=s.what)) for s in TABLE
    }
    config = ConfigDict(extra="ignore", str_strip_whitespace=True)
    return create_model("ServerEnvironment", __config__=config, **fields)


_MODEL = _model()


def _given(env: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The variables set to something: an empty one means its default, as it always did."""
    return {n: env[n] for n in names if env.get(n, "").strip()}


def read(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting's value, from `env` (os.environ) or its default; SettingsError naming
    each bad one. Numbers are int/float, booleans bool, decimals their (checked) text."""
    env = os.environ if env is None else env
    given = _given(env, BY_NAME)
    try:
        parsed = _MODEL.model_validate(given)
    except ValidationError as exc:
        raise SettingsError(_problems(exc, given)) from None
    values = {}
    for setting in TABLE:
        value = getattr(parsed, setting.env)
        values[setting.env] = setting.default if value is None else value
    return values


def _problems(exc: ValidationError, given: Mapping[str, str]) -> list[str]:
    problems = []
    bad = {str(err["loc"][0]) for err in exc.errors()}
    for setting in (s for s in TABLE if s.env in bad):  # in the table's order
        name = setting.env
        got = "(hidden)" if setting.secret else repr(given[name])
        problems.append(f"{name}: got {got}, wants {setting.wants()}")
    return problems


def check(env: Mapping[str, str] | None = None) -> None:
    """Raise SettingsError if the server would refuse this environment (the CLI's check
    before it starts the web server, Celery or a management command)."""
    read(env)


# -- documentation -----------------------------------------------------------------------

BEGIN = "<!-- BEGIN GENERATED SETTINGS (gpuflex settings --markdown --write docs/settings.md) -->"
END = "<!-- END GENERATED SETTINGS -->"


def markdown() -> str:
    """docs/settings.md's reference table, one section per group."""
    lines: list[str] = []
    for section in dict.fromkeys(s.section for s in TABLE):
        lines += [
            f"### {section}",
            "",
            "| variable | default | wants | what |",
            "|---|---|---|---|",
        ]
        for s in (s for s in TABLE if s.section == section):
            lines.append(f"| `{s.env}` | `{s.default_text()}` | {s.wants()} | {s.what} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def with_table(document: str) -> str:
    """`document` with its generated section replaced by the current table (appended, with
    its markers, if it has none); the prose around it is kept."""
    block = f"{BEGIN}\n\n{markdown()}\n{END}"
    if BEGIN in document and END in document:
        head, _, rest = document.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + block + tail
    return document.rstrip() + "\n\n## Every setting\n\n" + block + "\n"
