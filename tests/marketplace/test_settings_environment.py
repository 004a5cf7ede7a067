"""The server's settings are one declared table (settings/environment.py): a bad value is
refused naming the variable, what it got and what it wants, every one at once, and the server
does not start; docs/settings.md documents every setting from that table (issue 36)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marketplace.server.settings import environment
from marketplace.server.settings.environment import BY_NAME, TABLE, SettingsError, read

ROOT = Path(__file__).resolve().parent.parent.parent
SETTINGS_DIR = ROOT / "marketplace" / "server" / "settings"
DOC = ROOT / "docs" / "settings.md"


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEX_")}
    environment_ = clean | {"GPUFLEX_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)} | env
    return subprocess.run(
        [sys.executable, *args], env=environment_, cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def test_a_bad_value_names_the_variable_what_it_got_and_what_it_wants() -> None:
    with pytest.raises(SettingsError) as refused:
        read({"GPUFLEX_NODE_TIMEOUT_S": "45s"})
    assert str(refused.value) == "GPUFLEX_NODE_TIMEOUT_S: got '45s', wants a number of seconds > 0"


def test_every_bad_value_is_listed_at_once_in_the_tables_order() -> None:
    bad = {
        "GPUFLEX_TICK_S": "0",  # out of bounds
        "GPUFLEX_DEFAULT_SHARDS": "four",
        "DEBUG": "maybe",
        "GPUFLEX_STORAGE": "ftp",
        "GPUFLEX_THROTTLE_KEY": "5/fortnight",
        "GPUFLEX_PLATFORM_FEE": "ten percent",
        "GPUFLEX_REPLICATION_SHARE": "1.5",
        "GPUFLEX_LEASE_TIMEOUT_S": "nan",
        "GPUFLEX_NODE_TIMEOUT_S": "30",  # a good one among them
    }
    with pytest.raises(SettingsError) as refused:
        read(bad)
    named = [line.split(":")[0] for line in refused.value.problems]
    order = [s.env for s in TABLE]
    assert set(named) == set(bad) - {"GPUFLEX_NODE_TIMEOUT_S"}
    assert named == sorted(named, key=order.index)
    assert "GPUFLEX_STORAGE: got 'ftp', wants 'filesystem' or 's3'" in refused.value.problems
    assert "GPUFLEX_REPLICATION_SHARE: got '1.5', wants a number >= 0 and <= 1" in (
        refused.value.problems
    )


def test_unset_or_empty_means_the_default_and_values_keep_their_types() -> None:
    values = read({"GPUFLEX_NODE_TIMEOUT_S": "", "GPUFLEX_KEY_CACHE_S": " 0 "})
    assert values["GPUFLEX_NODE_TIMEOUT_S"] == 45.0
    assert values["GPUFLEX_KEY_CACHE_S"] == 0.0
    assert read({"GPUFLEX_PRESENCE_IN_REDIS": "off"})["GPUFLEX_PRESENCE_IN_REDIS"] is False
    assert read({"GPUFLEX_DEFAULT_SHARDS": "8"})["GPUFLEX_DEFAULT_SHARDS"] == 8
    # money stays text, as the ledger reads it into Decimal itself
    assert read({"GPUFLEX_PLATFORM_FEE": "0.2"})["GPUFLEX_PLATFORM_FEE"] == "0.2"
    defaults = read({})
    assert all(defaults[s.env] == s.default for s in TABLE)


def test_the_django_settings_take_their_values_from_the_table(settings) -> None:
    assert settings.GPUFLEX["NODE_TIMEOUT_S"] == BY_NAME["GPUFLEX_NODE_TIMEOUT_S"].default
    assert settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["heartbeat"] == "120/min"
    assert settings.AXES_FAILURE_LIMIT == 10


def test_no_settings_module_reads_the_environment_by_hand() -> None:
    """Every variable goes through the table (test.py only sets defaults for the suite)."""
    for module in ("base.py", "production.py"):
        source = (SETTINGS_DIR / module).read_text()
        assert "os.environ" not in source and "getenv" not in source, module


def test_every_variable_a_settings_module_names_is_declared() -> None:
    """A settings module added beside base.py reads only declared (so documented) variables."""
    read_by_hand = re.compile(r"""(?:environ(?:\.get)?|getenv)\(?\[?\s*["']([A-Z][A-Z0-9_]+)["']""")
    for module in SETTINGS_DIR.glob("*.py"):
        if module.name in ("test.py", "environment.py"):
            continue
        names = set(read_by_hand.findall(module.read_text()))
        assert names <= set(BY_NAME), (module.name, sorted(names - set(BY_NAME)))


def test_gpuflex_serve_refuses_a_bad_setting_without_a_traceback(tmp_path: Path) -> None:
    out = run(["-m", "marketplace.cli", "serve", "--dev"], tmp_path, GPUFLEX_NODE_TIMEOUT_S="45s")
    assert out.returncode == 2
    assert "GPUFLEX_NODE_TIMEOUT_S: got '45s', wants a number of seconds > 0" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "gpuflex.sqlite3").exists()  # nothing started, not even migrate


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "marketplace.cli", "manage", "check"],
        ["-m", "marketplace.cli", "worker"],
        ["-m", "marketplace.cli", "beat"],
        ["-m", "marketplace.manage", "check"],  # what `serve` runs to migrate
    ],
)
def test_every_server_command_refuses_a_bad_setting(tmp_path: Path, args: list[str]) -> None:
    out = run(args, tmp_path, GPUFLEX_TICK_S="5s", DATABASE_URL="sqlite:///db.sqlite3")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "GPUFLEX_TICK_S: got '5s', wants a number of seconds > 0" in out.stderr
    assert "Traceback" not in out.stderr


def test_importing_the_settings_with_a_bad_value_names_it(tmp_path: Path) -> None:
    """granian or celery started by hand: the import fails with the same words."""
    code = "import marketplace.server.settings.base"
    out = run(["-c", code], tmp_path, GPUFLEX_TRUSTED_PROXIES="one")
    assert out.returncode != 0
    assert "SettingsError: GPUFLEX_TRUSTED_PROXIES: got 'one', wants a whole number >= 0" in (
        out.stderr
    )


# -- docs/settings.md --------------------------------------------------------------------


def test_every_setting_is_documented_and_the_table_is_current() -> None:
    doc = DOC.read_text()
    assert environment.with_table(doc) == doc, (
        "docs/settings.md is out of date: gpuflex settings --write docs/settings.md"
    )
    generated = doc.split(environment.BEGIN)[1].split(environment.END)[0]
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", generated, flags=re.M))
    assert documented == set(BY_NAME)
    assert all(s.what and s.section for s in TABLE)


def test_the_doc_keeps_its_prose_around_the_generated_table() -> None:
    doc = (
        "# Title\n\nprose\n\n"
        + environment.BEGIN
        + "\nSTALE ROW\n"
        + environment.END
        + "\n\nafter\n"
    )
    updated = environment.with_table(doc)
    assert updated.startswith("# Title\n\nprose\n\n") and updated.endswith("\n\nafter\n")
    assert "STALE ROW" not in updated and "`GPUFLEX_NODE_TIMEOUT_S`" in updated
