"""Settings in each OS's standard place (platformdirs) and credentials in the OS keyring.

GPUFLEX_NODE_CONFIG_DIR / GPUFLEX_NODE_DATA_DIR / GPUFLEX_NODE_CACHE_DIR override the folders
(services, tests, several agents on one machine; NODE_ because the marketplace server reads
GPUFLEX_DATA_DIR for its own data). On headless machines without a keyring backend the
keys go to a credentials file readable only by its owner (0600).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from dataclasses import asdict, dataclass, field, fields
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import platformdirs

from desktop import shared_file

log = logging.getLogger(__name__)

APP = "gpuflex"
KEYRING_SERVICE = "gpuflex"
# Settings.extra keys for one run only, set by desktop/fault_injection.py (tests, bench):
# never written to settings.json nor read from it, so no file turns a node into an attacker
RUN_ONLY_EXTRA = frozenset({"byzantine"})


@dataclass(frozen=True)
class Paths:
    config: Path
    data: Path
    cache: Path

    @classmethod
    def default(cls) -> Paths:
        env = os.environ.get
        return cls(
            config=Path(env("GPUFLEX_NODE_CONFIG_DIR") or platformdirs.user_config_dir(APP)),
            data=Path(env("GPUFLEX_NODE_DATA_DIR") or platformdirs.user_data_dir(APP)),
            cache=Path(env("GPUFLEX_NODE_CACHE_DIR") or platformdirs.user_cache_dir(APP)),
        )

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.json"

    @property
    def tasks(self) -> Path:
        return self.data / "tasks"

    @property
    def proofs(self) -> Path:
        """Uploaded tasks' boundary checkpoints, kept to reveal (desktop.proof_keeper)."""
        return self.data / "proofs"

    @property
    def journal(self) -> Path:
        return self.data / "journal.jsonl"


@dataclass
class Settings:
    server_url: str = "http://127.0.0.1:8000"
    dashboard_url: str = ""  # empty: the server's own web UI
    node_name: str = ""
    kind: str = "volunteer"  # "volunteer" | "platform"
    # an operator's token (gfx_e_…) that enrolls this machine as a platform node; the
    # marketplace registers a platform node only with one (docs/agent-api.md, Registration)
    enrollment_token: str = ""
    # in the realistic range the README names (1.20-3.00 per reference GPU-hour), near the
    # middle: the median asking price is what buyers are offered by default
    price_per_gpu_hour: str = "1.80"  # a decimal string, as the API carries money
    # work policy (BOINC's computing preferences)
    # "only when idle" is the default (issue #17): a machine nobody sits at (a server, no
    # display) is always idle, so headless agents work at once
    idle_minutes: float = 5.0  # 0: "always", even while the owner uses the computer
    pause_on_gpu_processes: bool = True
    max_gpu_temp_c: float = 83.0
    schedule_start: str = ""  # "HH:MM"; both empty: any time
    schedule_end: str = ""
    work_on_battery: bool = False
    gpu_memory_fraction: float = 0.9
    # GPUs (NVML / `gpuflex-node info` indices) this machine never lends; on a machine with
    # several GPUs every other one works as its own node (desktop.lanes). Read at start
    excluded_gpus: list[int] = field(default_factory=list)
    # at most this share of the time computing: steps are held back (fans, power, heat); not
    # billed, so the node is paid for the compute only (desktop.task_runner._duty_pace)
    max_gpu_busy_pct: int = 100
    # sandbox limits per task
    task_memory_mb: int = 8192
    task_cpu_s: int = 3600
    task_wall_s: int = 3600
    # seconds the warm task worker (torch and the trainer loaded, ~300 MB) stays up after the
    # last task: it starts when work is offered, so an idle node holds only the agent; 0 =
    # never kept warm (stopped as soon as the work is done)
    warm_idle_s: float = 300.0
    # the region this node declares itself in (sent at registration): jobs with
    # aggregation.hierarchy zones route its updates through the zone's aggregator
    zone: str = ""
    # platform nodes only: serve the zone's aggregator endpoint on this "host:port" (""
    # none), advertised to members as `zone_url` ("" = http://<zone_listen>)
    zone_listen: str = ""
    zone_url: str = ""
    # simulated network (demos, tests): "" for the real network
    network_profile: str = ""
    start_at_login: bool = False
    first_run_done: bool = False
    # declared local datasets (federated silos): desktop.local_datasets.LocalDataset dicts,
    # changed only through `gpuflex-node datasets` / the tray's Datasets page, which read
    # and check them first
    local_datasets: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def load_settings(paths: Paths | None = None) -> Settings:
    paths = paths or Paths.default()
    try:
        return _parse_settings(paths.settings_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Settings()
    except (OSError, ValueError, TypeError):
        pass
    # damaged: looked at again under the lock (a writer renames a whole file into place, so
    # this is not a half-written one), then moved aside for the owner and the defaults used:
    # a damaged settings file must not stop the agent
    with shared_file.locked(paths.settings_file):
        try:
            return _parse_settings(paths.settings_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Settings()
        except (OSError, ValueError, TypeError) as exc:
            broken = paths.settings_file.with_suffix(".broken")
            with contextlib.suppress(FileNotFoundError):
                paths.settings_file.replace(broken)
            log.warning("the settings file %s is damaged or holds a bad value (%s): "
                        "moved to %s, defaults used", paths.settings_file, exc, broken)  # fmt: skip
            return Settings()


def _parse_settings(text: str) -> Settings:
    """The file's settings, each value checked as a change through the local API is
    (apply_changes): a bad one is InvalidSettings (a ValueError) naming the field, and the
    file is treated as damaged. Fields this version does not know (a newer or older agent's)
    are ignored, as before."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in data.items() if k in known}
    extra = values.get("extra")
    if isinstance(extra, dict) and RUN_ONLY_EXTRA & extra.keys():
        # fault injection is never read from a file: only desktop/fault_injection.py's run
        log.warning("the settings file's extra %s ignored: fault injection is for tests only",
                    sorted(RUN_ONLY_EXTRA & extra.keys()))  # fmt: skip
        values["extra"] = {k: v for k, v in extra.items() if k not in RUN_ONLY_EXTRA}
    return _with_changes(Settings(), values, loading=True)


def save_settings(settings: Settings, paths: Paths | None = None) -> None:
    """Written whole, under the settings file's lock, through a temporary file of this
    writer's own (lanes and the CLI may save at the same moment)."""
    paths = paths or Paths.default()
    data = settings.to_dict()
    # this run's fault injection (desktop/fault_injection.py) is never saved
    data["extra"] = {k: v for k, v in data["extra"].items() if k not in RUN_ONLY_EXTRA}
    text = json.dumps(data, indent=2)
    with shared_file.locked(paths.settings_file):
        try:  # keep the owner's permissions on it; a new one is readable as before
            mode = stat.S_IMODE(os.stat(paths.settings_file).st_mode)
        except FileNotFoundError:
            mode = 0o644
        shared_file.write_atomic(paths.settings_file, text, mode)


# -------------------------------------------------------------------------- credentials


class CredentialsDamaged(RuntimeError):
    """The credentials file exists but its keys cannot be read; the message names it."""

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        super().__init__(
            f"the credentials file {path} {why}: its keys were not read and it was left as "
            "it is; repair it, or move it away and log in again (the node then registers as "
            "a new node)"
        )


class Credentials:
    """API keys: the provider key (`gfx_u_…`) and this node's key (`gfx_n_…`) per server."""

    def __init__(self, paths: Paths | None = None, use_keyring: bool | None = None) -> None:
        self.paths = paths or Paths.default()
        if use_keyring is None:
            use_keyring = os.environ.get("GPUFLEX_KEYRING", "auto") != "file" and _keyring_ok()
        self.use_keyring = use_keyring

    @property
    def file(self) -> Path:
        return self.paths.config / "credentials.json"

    @property
    def backend(self) -> str:
        return "OS keyring" if self.use_keyring else f"file {self.file} (0600)"

    def get(self, name: str) -> str | None:
        if self.use_keyring:
            import keyring

            try:
                return keyring.get_password(KEYRING_SERVICE, name)
            except Exception:
                pass
        return self._read_file().get(name)

    def set(self, name: str, value: str | None) -> None:
        if self.use_keyring:
            import keyring

            try:
                if value is None:
                    with contextlib.suppress(keyring.errors.PasswordDeleteError):
                        keyring.delete_password(KEYRING_SERVICE, name)
                else:
                    keyring.set_password(KEYRING_SERVICE, name, value)
                return
            except Exception:
                self.use_keyring = False  # locked or broken keyring: fall back for good
        # read, change and write under the file's lock: two lanes registering at once each
        # keep their node key (a damaged file raises here and is never overwritten)
        with shared_file.locked(self.file):
            data = self._read_file()
            if value is None:
                data.pop(name, None)
            else:
                data[name] = value
            # created 0600 from the start: never a moment where another user could read it
            shared_file.write_atomic(self.file, json.dumps(data), stat.S_IRUSR | stat.S_IWUSR)

    def _read_file(self) -> dict[str, str]:
        """The stored keys; {} only when there is no file yet. Anything else that keeps the
        keys from being read is CredentialsDamaged, never an empty store: a node that lost
        its key would register as a new node, without its trust or its earnings history."""
        try:
            text = self.file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CredentialsDamaged(self.file, f"cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise CredentialsDamaged(self.file, "is damaged: it is not UTF-8 text") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            why = f"is damaged: it is not valid JSON ({exc})"
            raise CredentialsDamaged(self.file, why) from None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            why = "is damaged: it is not a JSON object of names to keys"
            raise CredentialsDamaged(self.file, why)
        return data

    # Node keys are per server: one machine may contribute to a staging and a live marketplace
    def node_key(self, server: str) -> str | None:
        return self.get(f"node_key:{server}")

    def set_node_key(self, server: str, key: str | None) -> None:
        self.set(f"node_key:{server}", key)

    def node_id(self, server: str) -> str | None:
        return self.get(f"node_id:{server}")

    def set_node_id(self, server: str, node_id: str | None) -> None:
        self.set(f"node_id:{server}", node_id)

    def provider_key(self) -> str | None:
        return self.get("provider_key")

    def set_provider_key(self, key: str | None) -> None:
        self.set("provider_key", key)


def _keyring_ok() -> bool:
    """False when keyring only has its 'fail' or 'null' backends (headless Linux)."""
    try:
        import keyring

        kr = keyring.get_keyring()
        name = type(kr).__module__ + "." + type(kr).__name__
        return kr.priority > 0 and "fail" not in name and "null" not in name  # type: ignore[operator]
    except Exception:
        return False


# -------------------------------------------------------------------------- validation

_HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


class InvalidSettings(ValueError):
    """A change the agent refuses; the message names the field and what it must be."""


def apply_changes(current: Settings, changes: dict[str, Any]) -> Settings:
    """`current` with `changes` (field name -> value) applied, each checked: the one place
    settings from the local API (the tray, `gpuflex-node settings`) and from the settings file
    (load_settings) are validated."""
    return _with_changes(current, changes, loading=False)


def _with_changes(current: Settings, changes: dict[str, Any], *, loading: bool) -> Settings:
    """apply_changes; `loading`: the settings file's own values, where the declared local
    datasets are read back (the API changes them only through `datasets add/remove`)."""
    if not isinstance(changes, dict):
        raise InvalidSettings("settings must be a JSON object of field: value")
    kinds = {f.name: type(getattr(current, f.name)) for f in fields(Settings)}
    values = current.to_dict()
    for name, value in changes.items():
        kind = kinds.get(name)
        if kind is None:
            raise InvalidSettings(f"unknown setting {name!r}")
        if name == "local_datasets" and not loading:  # each is checked before it is declared
            raise InvalidSettings(
                "local_datasets change through 'gpuflex-node datasets add/remove' only"
            )
        # fault injection only through desktop/fault_injection.py, never from the local API
        run_only = RUN_ONLY_EXTRA & value.keys() if isinstance(value, dict) else set()
        if name == "extra" and not loading and run_only - current.extra.keys():
            raise InvalidSettings("extra: fault injection is for tests only")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise InvalidSettings(f"{name} must be a {kind.__name__}, not {value!r}")
        values[name] = value
    new = Settings.from_dict(values)
    _check(new)
    return new


def _check(s: Settings) -> None:
    try:
        price = Decimal(s.price_per_gpu_hour)
    except InvalidOperation:
        price = Decimal(-1)
    if not (price.is_finite() and price >= 0):
        raise InvalidSettings("price_per_gpu_hour must be a decimal string, 0 or more")
    if not s.server_url.startswith(("http://", "https://")):
        raise InvalidSettings("server_url must start with http:// or https://")
    if s.kind not in ("volunteer", "platform"):
        raise InvalidSettings("kind must be 'volunteer' or 'platform'")
    if bool(s.schedule_start) != bool(s.schedule_end) or not all(
        _HHMM.match(t) for t in (s.schedule_start, s.schedule_end) if t
    ):
        raise InvalidSettings("schedule_start and schedule_end must both be HH:MM, or both ''")
    if not 0 < s.gpu_memory_fraction <= 1:
        raise InvalidSettings("gpu_memory_fraction must be above 0 and at most 1")
    if s.idle_minutes < 0 or not 0 < s.max_gpu_temp_c <= 120:
        raise InvalidSettings("idle_minutes must be 0 or more, max_gpu_temp_c 1 to 120")
    if not s.warm_idle_s >= 0:  # also refuses NaN
        raise InvalidSettings("warm_idle_s must be 0 or more (seconds)")
    if isinstance(s.max_gpu_busy_pct, bool) or s.max_gpu_busy_pct not in range(5, 101):
        raise InvalidSettings("max_gpu_busy_pct must be a whole number from 5 to 100")
    if not all(isinstance(d, dict) for d in s.local_datasets):
        raise InvalidSettings("local_datasets must be a list of declared datasets")
    if not all(type(i) is int and 0 <= i < 64 for i in s.excluded_gpus):
        raise InvalidSettings("excluded_gpus must be a list of GPU indices (0 to 63)")
    for name in ("task_memory_mb", "task_cpu_s", "task_wall_s"):
        if getattr(s, name) <= 0:
            raise InvalidSettings(f"{name} must be positive")


def sign_in(
    key: str, settings: Settings, paths: Paths | None = None, creds: Credentials | None = None
) -> Credentials:
    """The one login (the CLI's `login`, and the agent's for the tray through the local API):
    the provider key stored, this server's node key dropped so the node registers afresh
    with that account, and the first run marked done."""
    key = key.strip()
    if not key.startswith("gfx_u_"):
        raise InvalidSettings("that does not look like a provider key (they start with gfx_u_)")
    creds = creds or Credentials(paths)
    creds.set_provider_key(key)
    creds.set_node_key(settings.server_url, None)
    settings.first_run_done = True
    save_settings(settings, paths)
    return creds
