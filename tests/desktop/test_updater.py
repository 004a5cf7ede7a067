"""Self-update with tufup: a v0.1 bundle updates itself to v0.2 from a TUF repository served
on loopback; tampered archives and metadata, rolled-back and frozen metadata are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("tufup")

from runtime_world import repo_tool

from desktop import updater

ROOT = Path(__file__).resolve().parents[2]


def _bundle(folder: Path, version: str, root_json: Path | None = None) -> Path:
    """A bundle folder as the PyInstaller spec lays it out: VERSION, programs, update/."""
    (folder / "update").mkdir(parents=True)
    (folder / "VERSION").write_text(version + "\n")
    program = folder / "gpuflex-node"
    program.write_text(f'#!/bin/sh\necho "gpuflex-node {version}"\n')
    program.chmod(0o755)
    (folder / "_internal").mkdir()
    (folder / "_internal" / f"lib-{version}.so").write_bytes(os.urandom(2048))
    if root_json:
        shutil.copyfile(root_json, folder / "update" / "root.json")
    return folder


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    monkeypatch.chdir(tmp_path)  # the repo tool changes directory; restored after the test
    tool = repo_tool()
    pub = tmp_path / "pub"
    root_json = tool.init(pub)
    # the publisher released 0.1 earlier; this machine installed it (with the trusted root)
    tool.add(pub, _bundle(tmp_path / "build" / "0.1", "0.1.0", root_json))
    installed = _bundle(tmp_path / "home" / "opt" / "gpuflex", "0.1.0", root_json)
    metadata_at_01 = tmp_path / "metadata-0.1"
    shutil.copytree(pub / "repository" / "metadata", metadata_at_01)
    tool.add(pub, _bundle(tmp_path / "build" / "0.2", "0.2.0", root_json))
    served = pub / "repository"
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    source = updater.UpdateSource(url=url, install_dir=installed, cache_dir=tmp_path / "cache")
    try:
        yield {"tool": tool, "pub": pub, "served": served, "source": source, "url": url,
               "installed": installed, "metadata_at_01": metadata_at_01}  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_installed_bundle_updates_itself_to_the_new_version(world: dict, tmp_path: Path) -> None:
    installed: Path = world["installed"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUFLEX_NODE_CACHE_DIR": str(tmp_path / "c")}
    cmd = [sys.executable, "-m", "desktop.cli", "update", "--install-dir", str(installed),
           "--url", world["url"]]  # fmt: skip
    check = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert check.returncode == 0, check.stderr
    assert "update available: 0.1.0 -> 0.2.0" in check.stdout
    assert (installed / "VERSION").read_text().strip() == "0.1.0"  # a check changes nothing

    done = subprocess.run([*cmd, "--apply"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "updated 0.1.0 -> 0.2.0" in done.stdout
    assert (installed / "VERSION").read_text().strip() == "0.2.0"
    out = subprocess.run([str(installed / "gpuflex-node")], capture_output=True, text=True)
    assert out.stdout.strip() == "gpuflex-node 0.2.0"
    # the whole folder was replaced: 0.1's files are gone, no staging or old copy is left
    assert not (installed / "_internal" / "lib-0.1.0.so").exists()
    assert sorted(p.name for p in installed.parent.iterdir()) == ["gpuflex"]
    again = subprocess.run([*cmd, "--apply"], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "up to date (0.2.0)" in again.stdout


def test_tampered_archive_is_refused_and_the_install_is_untouched(world: dict) -> None:
    installed: Path = world["installed"]
    before = _snapshot(installed)
    archive = world["served"] / "targets" / "gpuflex-0.2.0.tar.gz"
    # an attacker on the mirror swaps in their own build of "0.2.0" (a valid tar.gz)
    evil = _bundle(archive.parent.parent.parent / "evil", "0.2.0")
    (evil / "gpuflex-node").write_text("#!/bin/sh\necho pwned\n")
    shutil.make_archive(str(archive).removesuffix(".tar.gz"), "gztar", evil)

    with pytest.raises(updater.UpdateError, match=r"refused: LengthOrHashMismatchError"):
        updater.apply(world["source"])
    assert _snapshot(installed) == before
    assert not any(p.name.startswith(".gpuflex") for p in installed.parent.iterdir())


def test_tampered_metadata_is_refused(world: dict) -> None:
    timestamp = world["served"] / "metadata" / "timestamp.json"
    meta = json.loads(timestamp.read_text())
    meta["signed"]["expires"] = "2099-01-01T00:00:00Z"  # changed without the timestamp key
    timestamp.write_text(json.dumps(meta))
    with pytest.raises(updater.UpdateError, match=r"metadata refused: UnsignedMetadataError"):
        updater.check(world["source"])
    assert (world["installed"] / "VERSION").read_text().strip() == "0.1.0"


def test_rolled_back_metadata_is_refused(world: dict) -> None:
    assert updater.check(world["source"]) == "0.2.0"  # this machine now trusts 0.2's metadata
    # a mirror (or attacker) serves the older, validly signed metadata that hides 0.2
    shutil.rmtree(world["served"] / "metadata")
    shutil.copytree(world["metadata_at_01"], world["served"] / "metadata")
    with pytest.raises(updater.UpdateError, match=r"metadata refused: BadVersionNumberError"):
        updater.check(world["source"])


def test_frozen_metadata_is_refused(world: dict) -> None:
    # the timestamp role's signature expired (the server stopped re-signing, or an attacker
    # replays a stale one): the client must not trust that view of the repository
    repo = world["tool"]._repository(world["pub"])
    repo.roles.set_expiration_date(role_name="timestamp", days=-1)
    repo.publish_changes(private_key_dirs=[world["pub"] / "keystore"])
    with pytest.raises(updater.UpdateError, match=r"metadata refused: ExpiredMetadataError"):
        updater.check(world["source"])


def test_older_or_equal_versions_are_never_offered(world: dict, tmp_path: Path) -> None:
    root_json = world["installed"] / "update" / "root.json"
    newer = _bundle(tmp_path / "other" / "gpuflex", "0.3.0", root_json)
    source = updater.UpdateSource(world["url"], newer, tmp_path / "cache3")
    assert updater.check(source) is None
    assert updater.apply(source) is None
    assert (newer / "VERSION").read_text().strip() == "0.3.0"


def test_bundle_without_trusted_root_is_refused(world: dict) -> None:
    (world["installed"] / "update" / "root.json").unlink()
    with pytest.raises(updater.UpdateError, match="no trusted root metadata"):
        updater.check(world["source"])


def test_a_system_package_install_is_left_to_apt(world: dict) -> None:
    (world["installed"] / "update" / "packaged").write_text("deb\n")
    with pytest.raises(updater.UpdateError, match=r"system package \(deb\): update it with apt"):
        updater.apply(world["source"])
    assert (world["installed"] / "VERSION").read_text().strip() == "0.1.0"
