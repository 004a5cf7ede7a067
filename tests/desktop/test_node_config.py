"""Settings and credentials storage, and the task journal."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from desktop.config import (
    Credentials,
    InvalidSettings,
    Paths,
    Settings,
    apply_changes,
    load_settings,
    save_settings,
)
from desktop.journal import Journal


def test_settings_round_trip_and_damaged_file(isolated_dirs: Paths) -> None:
    assert load_settings(isolated_dirs) == Settings()
    s = Settings(server_url="https://m.example", price_per_gpu_hour="0.55", idle_minutes=5)
    save_settings(s, isolated_dirs)
    assert load_settings(isolated_dirs) == s
    isolated_dirs.settings_file.write_text("{broken")
    assert load_settings(isolated_dirs) == Settings()
    assert isolated_dirs.settings_file.with_suffix(".broken").exists()


def test_credentials_file_fallback_is_private(isolated_dirs: Paths) -> None:
    c = Credentials(isolated_dirs, use_keyring=False)
    c.set_provider_key("gfx_u_abc")
    c.set_node_key("https://m", "gfx_n_1")
    assert Credentials(isolated_dirs, use_keyring=False).provider_key() == "gfx_u_abc"
    assert c.node_key("https://m") == "gfx_n_1" and c.node_key("https://other") is None
    mode = stat.S_IMODE(os.stat(c.file).st_mode)
    assert mode == 0o600
    c.set_node_key("https://m", None)
    assert c.node_key("https://m") is None


def test_keyring_is_used_when_it_works(isolated_dirs: Paths, monkeypatch) -> None:
    import keyring

    store: dict[tuple[str, str], str] = {}
    monkeypatch.setattr(keyring, "set_password", lambda s, n, v: store.__setitem__((s, n), v))
    monkeypatch.setattr(keyring, "get_password", lambda s, n: store.get((s, n)))
    c = Credentials(isolated_dirs, use_keyring=True)
    c.set_provider_key("gfx_u_kr")
    assert store == {("gpuflex", "provider_key"): "gfx_u_kr"}
    assert c.provider_key() == "gfx_u_kr" and not c.file.exists()


def test_journal_survives_a_torn_write_and_compacts(tmp_path) -> None:
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.record("a", "claimed", task={"id": "a"})
    j.record("a", "ready")
    j.record("b", "claimed", task={"id": "b"})
    j.record("b", "done", outcome="uploaded")
    with open(path, "a") as f:
        f.write('{"id": "a", "state": "trai')  # the process died mid-write
    again = Journal(path)
    assert again.get("a").state == "ready" and again.get("a").task == {"id": "a"}
    assert [r.id for r in again.open()] == ["a"]
    assert again.get("b").outcome == "uploaded"
    assert all(
        line.startswith("{") and line.endswith("}") for line in path.read_text().splitlines()
    )


def test_the_work_policy_defaults_to_only_when_idle_and_checks_the_gpu_use_cap() -> None:
    import pytest

    from desktop.config import InvalidSettings, Settings, apply_changes

    assert Settings().idle_minutes > 0 and Settings().max_gpu_busy_pct == 100
    assert apply_changes(Settings(), {"max_gpu_busy_pct": 40}).max_gpu_busy_pct == 40
    for bad in (0, 4, 101, 50.5, True):
        with pytest.raises(InvalidSettings, match="max_gpu_busy_pct"):
            apply_changes(Settings(), {"max_gpu_busy_pct": bad})


def test_a_new_nodes_price_is_in_the_realistic_range() -> None:
    """#37: a new node asked 0.40, below the 1.20-3.00 per reference GPU-hour the README
    calls realistic (and the demo's nodes ask)."""
    from decimal import Decimal

    assert Decimal("1.20") <= Decimal(Settings().price_per_gpu_hour) <= Decimal("3.00")


# ------------------------------------------------------ credentials shared by lanes (#32)

WRITERS = 16  # lanes registering at the same moment


def _register_lanes(config_dir: str, first: int, count: int, barrier) -> None:
    """One writer (a thread, or a process's main thread): its lanes' node keys and ids, each
    set as the agent sets them (desktop.presence.Presence.register), all released together."""
    from pathlib import Path

    from desktop.config import Credentials, Paths

    root = Path(config_dir)
    creds = Credentials(Paths(config=root, data=root, cache=root), use_keyring=False)
    barrier.wait()
    for lane in range(first, first + count):
        creds.set_node_key(f"https://m#gpu{lane}", f"gfx_n_{lane}")
        creds.set_node_id(f"https://m#gpu{lane}", str(lane))


def test_lanes_registering_at_once_in_threads_all_keep_their_keys(isolated_dirs: Paths) -> None:
    """Issue #32: two lanes read-modified-wrote credentials.json through one temporary file
    with no lock, and one lane's node key was lost."""
    import threading

    Credentials(isolated_dirs, use_keyring=False).set_provider_key("gfx_u_owner")
    barrier = threading.Barrier(WRITERS)
    errors: list[BaseException] = []

    def lane(i: int) -> None:
        try:
            _register_lanes(str(isolated_dirs.config), i * 4, 4, barrier)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    creds = Credentials(isolated_dirs, use_keyring=False)
    assert creds.provider_key() == "gfx_u_owner"
    for lane_no in range(WRITERS * 4):
        assert creds.node_key(f"https://m#gpu{lane_no}") == f"gfx_n_{lane_no}", lane_no
        assert creds.node_id(f"https://m#gpu{lane_no}") == str(lane_no)
    assert stat.S_IMODE(os.stat(creds.file).st_mode) == 0o600
    # every writer's temporary file went: renamed into place, none left behind
    assert sorted(p.name for p in creds.file.parent.iterdir()) == [
        "credentials.json", "credentials.json.lock"]  # fmt: skip


def test_agents_in_several_processes_registering_at_once_all_keep_their_keys(
    isolated_dirs: Paths,
) -> None:
    """The same across processes (two agents, or the CLI beside the agent): the file lock."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a test process's threads
    procs = 4
    barrier = ctx.Barrier(procs)
    workers = [
        ctx.Process(target=_register_lanes, args=(str(isolated_dirs.config), i * 8, 8, barrier))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * procs
    creds = Credentials(isolated_dirs, use_keyring=False)
    for lane_no in range(procs * 8):
        assert creds.node_key(f"https://m#gpu{lane_no}") == f"gfx_n_{lane_no}", lane_no


def test_a_damaged_credentials_file_is_an_error_naming_it_never_an_empty_store(
    isolated_dirs: Paths,
) -> None:
    import pytest

    from desktop.config import CredentialsDamaged

    c = Credentials(isolated_dirs, use_keyring=False)
    c.set_node_key("https://m", "gfx_n_1")
    for damaged in ('{"node_key:https://m": "gfx_n_1"', "[1, 2]", '{"a": 1}', "", "\xff"):
        c.file.write_bytes(damaged.encode("latin-1"))
        with pytest.raises(CredentialsDamaged, match=r"credentials file .*credentials\.json"):
            c.node_key("https://m")
        # a write never replaces it with a store that lost the other keys
        with pytest.raises(CredentialsDamaged, match="is damaged"):
            c.set_node_key("https://other", "gfx_n_2")
        assert c.file.read_bytes() == damaged.encode("latin-1")


def test_settings_saved_from_many_threads_are_always_whole(isolated_dirs: Paths) -> None:
    """Lanes and the tray save settings at once: each save is whole (never a half-written or
    a vanished temporary file), and a reader meanwhile never sees a damaged one."""
    import threading

    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def saver(i: int) -> None:
        try:
            barrier.wait()
            for n in range(10):
                save_settings(Settings(node_name=f"lane{i}-{n}"), isolated_dirs)
                assert load_settings(isolated_dirs).node_name.startswith("lane")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert load_settings(isolated_dirs).node_name.endswith("-9")
    assert not isolated_dirs.settings_file.with_suffix(".broken").exists()
    assert not [p for p in isolated_dirs.config.iterdir() if p.name.endswith(".tmp")]


def _saved_then_edited(paths: Paths, **edits) -> None:
    """The owner's settings file, written by the agent, then edited by hand."""
    save_settings(Settings(server_url="https://m.example", node_name="rig"), paths)
    data = json.loads(paths.settings_file.read_text())
    paths.settings_file.write_text(json.dumps(data | edits))


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"gpu_memory_fraction": 1.5}, "gpu_memory_fraction"),
        ({"task_wall_s": "3600"}, "task_wall_s"),
        ({"kind": "attacker"}, "kind"),
        ({"price_per_gpu_hour": "free"}, "price_per_gpu_hour"),
        ({"schedule_start": "25:00", "schedule_end": "07:00"}, "schedule_start"),
        ({"local_datasets": ["not a dataset"]}, "local_datasets"),
    ],
)
def test_a_bad_value_in_the_settings_file_is_refused_naming_the_field(
    isolated_dirs: Paths, caplog, edit, named
) -> None:
    """settings.json is checked on load as a change through the local API is (issue 36): a
    bad value is not run on; the file is moved aside, as a damaged one is, saying which."""
    _saved_then_edited(isolated_dirs, **edit)
    with caplog.at_level(logging.WARNING, logger="desktop.config"):
        assert load_settings(isolated_dirs) == Settings()
    assert isolated_dirs.settings_file.with_suffix(".broken").exists()
    assert named in caplog.text and "moved to" in caplog.text


def test_a_good_settings_file_loads_with_its_datasets_and_unknown_fields(
    isolated_dirs: Paths,
) -> None:
    dataset = {"name": "clinic", "path": "/data/clinic.csv", "rows": 10}
    _saved_then_edited(isolated_dirs, local_datasets=[dataset], from_a_newer_agent=True)
    loaded = load_settings(isolated_dirs)
    assert loaded.node_name == "rig" and loaded.local_datasets == [dataset]
    assert not isolated_dirs.settings_file.with_suffix(".broken").exists()


def test_fault_injection_is_never_read_from_nor_saved_to_the_settings_file(
    isolated_dirs: Paths,
) -> None:
    _saved_then_edited(isolated_dirs, extra={"byzantine": "sign_flip:10", "compute_scale": 2})
    assert load_settings(isolated_dirs).extra == {"compute_scale": 2}
    attacking = Settings(extra={"byzantine": "noise:30.0"})  # desktop.fault_injection's run
    save_settings(attacking, isolated_dirs)
    assert load_settings(isolated_dirs).extra == {}
    with pytest.raises(InvalidSettings, match="fault injection"):
        apply_changes(Settings(), {"extra": {"byzantine": "sign_flip:10"}})
