"""The lean `.deb` in a fresh root fetches its training runtime (issue 32): installed into a
root with an empty dpkg database, the package's own `gpuflex-node runtime fetch` gets the `cpu`
pack `make package` built from a TUF repository served over loopback, its `gpuflex-node run`
trains a task with it, and then a tampered pack and rolled-back metadata are refused with the
last good runtime still in use. Runs in `make package` (PACKAGE_TESTS); skips without dist/'s
.deb and pack. The time it takes is the footprint bench's `install_to_first_task_s`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from fresh_install import built_cpu_pack, built_deb, fresh_node
from runtime_world import repo_tool, tiny_pack

DEB, PACK = built_deb(), built_cpu_pack()

HAVE_DPKG = bool(shutil.which("dpkg-deb") and shutil.which("dpkg"))
pytestmark = [
    pytest.mark.skipif(not HAVE_DPKG, reason="needs dpkg (Debian)"),
    pytest.mark.skipif(
        not (DEB and PACK),
        reason="needs dist/gpuflex_*.deb and dist/runtime/cpu-*.tar.gz (make package)",
    ),
]


def _in_use(node) -> dict:
    listed = node.runtime("list", "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def test_fresh_install_fetches_the_cpu_pack_trains_and_refuses_bad_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the repo tool changes directory
    _fetch_train_refuse(tmp_path)


CHROOT = os.environ.get("GPUFLEX_TEST_CHROOT", "")


@pytest.mark.skipif(
    not (CHROOT and os.geteuid() == 0),
    reason="needs root and GPUFLEX_TEST_CHROOT: a Debian root made by debootstrap "
    "(installers/README.md); apt in it fetches the package's Depends",
)
def test_in_a_debian_chroot_the_deb_fetches_the_cpu_pack_trains_and_refuses_bad_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _fetch_train_refuse(tmp_path, chroot=Path(CHROOT))


def _fetch_train_refuse(tmp_path: Path, chroot: Path | None = None) -> None:
    assert DEB and PACK
    manifest = json.loads(PACK.with_suffix("").with_suffix(".json").read_text())
    with fresh_node(DEB, PACK, tmp_path, chroot) as node:  # installed, fetched, a task trained
        good = _in_use(node)
        assert good["in_use"]["source"] == "pack" and good["in_use"]["plan"] == "cpu"
        assert [(p["sha256"], p["current"]) for p in good["installed"]] == [
            (manifest["sha256"], True)
        ]
        assert node.runtime("verify").stdout.strip().endswith(": ok")

        # the publisher's repository, as it was when the node fetched: for the rollback below
        before = tmp_path / "metadata-before"
        shutil.copytree(node.pub / "repository" / "metadata", before)

        # a newer cpu pack is published, and the mirror serves other bytes for it
        newer = tiny_pack(tmp_path / "newer", torch_version="2.13.1")
        repo_tool().add_runtime(node.pub, tmp_path / "newer" / "out" / newer.archive)
        served = node.pub / "repository" / "targets" / "runtime" / newer.archive
        data = bytearray(served.read_bytes())
        data[len(data) // 2] ^= 0xFF
        served.write_bytes(bytes(data))
        tampered = node.runtime("fetch", "--plan", "cpu")
        assert tampered.returncode == 1
        assert "refused: LengthOrHashMismatchError" in tampered.stderr, tampered.stderr
        assert _in_use(node) == good
        assert node.runtime("verify").stdout.strip().endswith(": ok")

        # the mirror rolls the repository back to the metadata before that publication
        metadata = node.pub / "repository" / "metadata"
        shutil.rmtree(metadata)
        shutil.copytree(before, metadata)
        rolled = node.runtime("fetch", "--plan", "cpu")
        assert rolled.returncode == 1
        assert "metadata refused: BadVersionNumberError" in rolled.stderr, rolled.stderr
        assert _in_use(node) == good
        verified = node.runtime("verify")
        assert verified.returncode == 0 and verified.stdout.strip().endswith(": ok")
