"""Runtime packs (docs/runtime-packs.md): plan-class choice, the store that keeps the last good
runtime, and fetching packs through TUF from a repository served on loopback, where a
missing, half-downloaded, tampered or rolled-back pack leaves the runtime in use as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from runtime_world import ROOT, copy_metadata, repo_tool, served, tiny_pack, tiny_site

from desktop.runtime import fetch, pack, plan, target
from desktop.runtime.store import Store

pytest.importorskip("tufup")

LINUX = {"system": "Linux", "arch": "x86_64"}


# ------------------------------------------------------------------------- plan classes


def test_an_nvidia_driver_new_enough_gets_cuda12() -> None:
    machine = plan.Machine(nvidia_driver="575.64.03", **LINUX)
    got = plan.choose(machine, {"cpu": {}, "cuda12": {"min_driver": "570.26", "cuda": "12.8"}})
    assert got.plan == "cuda12"


def test_an_nvidia_driver_too_old_falls_back_to_cpu_and_says_so() -> None:
    machine = plan.Machine(nvidia_driver="535.183.01", **LINUX)
    got = plan.choose(machine, {"cpu": {}, "cuda12": {"min_driver": "570.26", "cuda": "12.8"}})
    assert got.plan == "cpu"
    assert "535.183.01 is older than the 570.26" in got.reason and "update the driver" in got.reason


def test_the_newest_cuda_the_driver_runs_is_chosen() -> None:
    published = {"cpu": {}, "cuda12": {"min_driver": "570.26", "cuda": "12.8"},
                 "cuda13": {"min_driver": "580.65.06", "cuda": "13.0"}}  # fmt: skip
    for driver, want in [("590.10", "cuda13"), ("580.65.06", "cuda13"), ("575.51.03", "cuda12"),
                         ("550.54.14", "cpu")]:  # fmt: skip
        assert plan.choose(plan.Machine(nvidia_driver=driver, **LINUX), published).plan == want


def test_driver_versions_compare_as_numbers_not_text() -> None:
    assert plan.driver_ok("1000.1", "570.26") and plan.driver_ok("570.26", "570.26")
    assert not plan.driver_ok("570.9", "570.26") and not plan.driver_ok("", "570.26")
    assert not plan.driver_ok("garbage", "525.60.13")


def test_amd_apple_and_cpu_machines_and_unpublished_plans() -> None:
    published = {p: {} for p in plan.PLANS}
    assert plan.choose(plan.Machine(amd_gpu=True, **LINUX), published).plan == "rocm"
    assert plan.choose(plan.Machine("Darwin", "arm64", apple_gpu=True), published).plan == "mps"
    assert plan.choose(plan.Machine(**LINUX), published).plan == "cpu"
    # a GPU plan that nobody publishes: the cpu runtime, saying why
    got = plan.choose(plan.Machine(amd_gpu=True, **LINUX), {"cpu": {}})
    assert got.plan == "cpu" and "no rocm pack is published" in got.reason


def test_machine_from_detected_gpus() -> None:
    gpus = [SimpleNamespace(vendor="nvidia", driver="580.65.06")]
    assert plan.Machine.from_gpus(gpus, "Linux", "x86_64").nvidia_driver == "580.65.06"
    assert plan.Machine.from_gpus([], "Darwin", "arm64").apple_gpu


# ----------------------------------------------------------------------------- the store


def test_pack_is_content_addressed_and_describes_itself(tmp_path: Path) -> None:
    m = tiny_pack(tmp_path, "cuda12", cuda="12.8")
    archive = tmp_path / "out" / m.archive
    assert m.archive == f"cuda12-{pack.sha256_file(archive)}.tar.gz"
    assert (m.torch, m.cuda, m.min_driver) == ("2.13.0", "12.8", "570.26")
    assert m.python == pack.python_tag() and m.size == archive.stat().st_size
    cpu_site = tiny_site(tmp_path / "cpu-build")
    with pytest.raises(pack.PackError, match="is not a CUDA build"):
        pack.build(cpu_site, "cuda12", tmp_path / "x")
    with pytest.raises(pack.PackError, match=r"CUDA 12\.8 build, not cuda13: build it as cuda12"):
        pack.build(tmp_path / "build-cuda12-2.13.0" / "site-packages", "cuda13", tmp_path / "x")
    with pytest.raises(pack.PackError, match="a GPU build, not cpu"):
        pack.build(tmp_path / "build-cuda12-2.13.0" / "site-packages", "cpu", tmp_path / "x")


def test_installed_pack_is_read_only_and_verifies(tmp_path: Path) -> None:
    m = tiny_pack(tmp_path)
    store = Store(tmp_path / "data")
    got = store.install(tmp_path / "out" / m.archive, m)
    assert store.current() == got and got.path.name == f"cpu-{m.sha256[:16]}"
    module = got.site_packages / "packmark.py"
    assert not os.access(got.site_packages, os.W_OK) or os.geteuid() == 0
    assert module.stat().st_mode & 0o222 == 0 and got.site_packages.stat().st_mode & 0o222 == 0
    assert store.verify("cpu") == []
    # someone changes a file of the pack (as root could): verify says which
    module.chmod(0o644)
    module.write_text("WHERE = 'evil'\n")
    changed = "site-packages/packmark.py"
    assert store.verify("cpu") == [f"changed: {changed}", f"writable: {changed}"]


def test_a_new_pack_keeps_the_previous_and_remove_falls_back_to_it(tmp_path: Path) -> None:
    old, new = tiny_pack(tmp_path, torch_version="2.12.0"), tiny_pack(tmp_path)
    store = Store(tmp_path / "data")
    store.install(tmp_path / "out" / old.archive, old)
    store.install(tmp_path / "out" / new.archive, new)
    assert store.current().manifest.torch == "2.13.0"
    assert sorted(p.manifest.torch for p in store.installed()) == ["2.12.0", "2.13.0"]
    assert [p.manifest.torch for p in store.installed() if p.current] == ["2.13.0"]
    store.remove(new.name)
    assert store.current().manifest.torch == "2.12.0"
    assert not (tmp_path / "data" / "runtimes" / new.name).exists()


def test_an_archive_that_does_not_match_its_manifest_is_not_unpacked(tmp_path: Path) -> None:
    m = tiny_pack(tmp_path)
    store = Store(tmp_path / "data")
    archive = tmp_path / "out" / m.archive
    archive.write_bytes(archive.read_bytes()[:-10])
    with pytest.raises(pack.PackError, match="does not match its manifest's sha256"):
        store.install(archive, m)
    assert store.current() is None and not store.installed()


# ------------------------------------------------------------------------ TUF fetching


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A publisher repository with the app (0.1.0) and a cpu pack (torch 2.12.0) published; this
    machine fetched that pack; then torch 2.13.0 was published."""
    monkeypatch.chdir(tmp_path)  # the repo tool changes directory; restored after the test
    tool = repo_tool()
    pub = tmp_path / "pub"
    root_json = tool.init(pub)
    app = tmp_path / "bundle"
    app.mkdir()
    (app / "VERSION").write_text("0.1.0\n")
    tool.add(pub, app)  # the app's own update target shares the repository and keys
    old = tiny_pack(tmp_path, torch_version="2.12.0")
    tool.add_runtime(pub, tmp_path / "out" / old.archive)
    with served(pub / "repository") as url:
        source = fetch.Source(url=url, cache_dir=tmp_path / "cache" / "update", root=root_json)
        store = Store(tmp_path / "data")
        first, _ = fetch.fetch(source, store, plan="cpu")
        assert first.manifest.torch == "2.12.0"
        before = copy_metadata(pub, tmp_path / "metadata-old")
        new = tiny_pack(tmp_path)
        tool.add_runtime(pub, tmp_path / "out" / new.archive)
        yield SimpleNamespace(tool=tool, pub=pub, source=source, store=store, url=url,
                              old=old, new=new, before=before, root=root_json)  # fmt: skip


def _in_use(world: SimpleNamespace) -> str:
    current = world.store.current()
    assert current is not None
    assert (current.site_packages / "packmark.py").is_file()
    return current.manifest.torch


def test_fetch_installs_the_new_pack_with_progress_and_keeps_the_last(world) -> None:
    seen: list[tuple[int, int]] = []
    got, _choice = fetch.fetch(world.source, world.store, plan="cpu",
                              progress=lambda n, total: seen.append((n, total)))  # fmt: skip
    assert got.manifest.sha256 == world.new.sha256 and _in_use(world) == "2.13.0"
    assert seen and seen[-1] == (world.new.size, world.new.size)
    assert sorted(p.manifest.torch for p in world.store.installed()) == ["2.12.0", "2.13.0"]
    state = json.loads((world.store.root / fetch.PROGRESS_FILE).read_text())
    assert state["active"] is False and state["bytes"] == state["total"] == world.new.size
    # the app updater still sees only the app's archives (packs live in a delegated role)
    from desktop import updater

    app = world.pub.parent / "installed"
    (app / "update").mkdir(parents=True)
    (app / "VERSION").write_text("0.0.9\n")
    shutil.copyfile(world.root, app / "update" / "root.json")
    source = updater.UpdateSource(world.url, app, world.source.cache_dir)
    assert updater.check(source) == "0.1.0"


def test_plan_from_the_machine_and_a_missing_pack(world) -> None:
    machine = plan.Machine(nvidia_driver="580.65.06", **LINUX)
    # the repository publishes only cpu: an NVIDIA machine is told so and runs cpu
    _got, choice = fetch.fetch(world.source, world.store, machine=machine)
    assert choice.plan == "cpu" and "no CUDA pack (cuda13, cuda12) is published" in choice.reason
    with pytest.raises(fetch.FetchError, match=r"no cuda12 runtime pack is published .*cpu\)"):
        fetch.fetch(world.source, world.store, plan="cuda12")
    assert _in_use(world) == "2.13.0"


def test_a_tampered_pack_is_refused_and_the_last_good_stays(world) -> None:
    served_archive = world.pub / "repository" / "targets" / "runtime" / world.new.archive
    data = bytearray(served_archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same length, other bytes
    served_archive.write_bytes(bytes(data))
    with pytest.raises(fetch.FetchError, match="refused: LengthOrHashMismatchError"):
        fetch.fetch(world.source, world.store, plan="cpu")
    assert _in_use(world) == "2.12.0"
    assert [p.manifest.torch for p in world.store.installed()] == ["2.12.0"]
    assert not list(world.source.downloads_dir.glob("*.tar.gz*"))


def test_a_half_downloaded_pack_is_refused_and_the_last_good_stays(world) -> None:
    served_archive = world.pub / "repository" / "targets" / "runtime" / world.new.archive
    served_archive.write_bytes(served_archive.read_bytes()[: world.new.size // 2])
    with pytest.raises(fetch.FetchError, match="refused: LengthOrHashMismatchError"):
        fetch.fetch(world.source, world.store, plan="cpu")
    assert _in_use(world) == "2.12.0"
    # a download cut off earlier (the agent was killed) is never taken for a pack: the next
    # fetch, from a mirror that serves it whole again, downloads it afresh
    part = world.source.downloads_dir / world.new.archive
    part.write_bytes(b"half")
    shutil.copyfile(world.pub.parent / "out" / world.new.archive, served_archive)
    got, _ = fetch.fetch(world.source, world.store, plan="cpu")
    assert got.manifest.sha256 == world.new.sha256 and _in_use(world) == "2.13.0"


def test_a_rolled_back_repository_is_refused_and_the_runtime_stays(world) -> None:
    fetch.fetch(world.source, world.store, plan="cpu")
    assert _in_use(world) == "2.13.0"
    # a mirror (or attacker) serves the older, validly signed metadata naming torch 2.12.0
    metadata = world.pub / "repository" / "metadata"
    shutil.rmtree(metadata)
    shutil.copytree(world.before, metadata)
    with pytest.raises(fetch.FetchError, match="metadata refused: BadVersionNumberError"):
        fetch.fetch(world.source, world.store, plan="cpu")
    assert _in_use(world) == "2.13.0"


def test_a_pack_signed_by_another_key_is_refused(world, tmp_path: Path) -> None:
    runtime_json = world.pub / "repository" / "metadata" / "runtime.json"
    meta = json.loads(runtime_json.read_text())
    target = f"runtime/{world.new.archive}"
    meta["signed"]["targets"][target]["length"] += 1  # edited without the targets key
    runtime_json.write_text(json.dumps(meta))
    with pytest.raises(fetch.FetchError, match=r"refused: .*(Unsigned|BadVersion|Length)"):
        fetch.fetch(world.source, world.store, plan="cpu")
    assert _in_use(world) == "2.12.0"


def test_a_pack_for_another_python_is_refused(world, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target, "python_tag", lambda: "cp399")
    with pytest.raises(fetch.FetchError, match=r"built for cp3.* this agent runs cp399"):
        fetch.fetch(world.source, world.store, plan="cpu")
    assert _in_use(world) == "2.12.0"


def test_no_trusted_root_is_an_error(tmp_path: Path) -> None:
    source = fetch.Source(url="http://127.0.0.1:9", cache_dir=tmp_path / "c", root=None)
    with pytest.raises(fetch.FetchError, match="no trusted root metadata"):
        fetch.fetch(source, Store(tmp_path / "d"), plan="cpu")


# ------------------------------------------------------------------------------ the CLI


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "desktop.cli", "runtime", *args],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip


def test_runtime_cli_fetches_lists_verifies_and_removes(world, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUFLEX_NODE_DATA_DIR": str(tmp_path / "d2"),
           "GPUFLEX_NODE_CACHE_DIR": str(tmp_path / "c2"),
           "GPUFLEX_UPDATE_URL": world.url}  # fmt: skip
    none = _cli("fetch", "--plan", "cpu", env=env)  # no trusted root yet: said, not a traceback
    assert none.returncode == 1 and "no trusted root metadata" in none.stderr
    got = _cli("fetch", "--plan", "cpu", "--root", str(world.root), env=env)
    assert got.returncode == 0, got.stderr
    assert f"cpu-{world.new.sha256[:16]}: cpu: torch 2.13.0" in got.stdout
    assert "100%" in got.stderr  # the progress bar
    listed = json.loads(_cli("list", "--json", env=env).stdout)
    assert [(p["torch"], p["current"]) for p in listed["installed"]] == [("2.13.0", True)]
    assert listed["in_use"]["source"] == "pack" and listed["in_use"]["plan"] == "cpu"
    ok = _cli("verify", env=env)
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": ok")
    module = tmp_path / "d2" / "runtimes" / f"cpu-{world.new.sha256[:16]}" / "site-packages"
    (module / "packmark.py").chmod(0o644)
    (module / "packmark.py").write_text("WHERE = 'evil'\n")
    bad = _cli("verify", "cpu", env=env)
    assert bad.returncode == 1 and "changed: site-packages/packmark.py" in bad.stdout
    gone = _cli("remove", "cpu", env=env)
    assert gone.returncode == 0 and "in use now: no pack" in gone.stdout
    # no pack left: the runtime is this environment's own torch (a dev install)
    after = _cli("list", env=env)
    assert "no runtime pack installed" in after.stdout
    assert "this agent's own environment" in after.stdout
    missing = _cli("remove", "cuda13", env=env)
    assert missing.returncode == 1 and "no runtime pack 'cuda13' is installed" in missing.stderr
