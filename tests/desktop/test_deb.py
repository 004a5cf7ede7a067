"""The .deb: built by installers/linux/build_deb.py, installed into a fresh dpkg root (its own
empty database), run from PATH there, then purged without leftovers.

The first test builds from a small bundle folder, so the packaging logic runs in `make test`
without PyInstaller; the second installs the real package when `make package` built it.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fresh_install import dpkg as _dpkg
from fresh_install import fresh_root as _fresh_root

ROOT = Path(__file__).resolve().parents[2]
BUILD_DEB = ROOT / "installers" / "linux" / "build_deb.py"
BUILT = sorted((ROOT / "dist").glob("gpuflex_*.deb"))

pytestmark = pytest.mark.skipif(
    not (shutil.which("dpkg-deb") and shutil.which("dpkg")), reason="needs dpkg (Debian)"
)


def _files(root: Path) -> list[str]:
    admin = root / "var" / "lib" / "dpkg"
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if not p.is_dir() and admin not in p.parents
    )


def _install_run_remove(deb: Path, root: Path, version: str) -> None:
    info = subprocess.run(["dpkg-deb", "--field", str(deb), "Package", "Version"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert info.split() == ["Package:", "gpuflex", "Version:", version]

    done = _dpkg(root, "--install", str(deb))
    assert done.returncode == 0, done.stderr
    status = _dpkg(root, "--status", "gpuflex")
    assert "Status: install ok installed" in status.stdout

    # on PATH in that root: /usr/bin holds both programs, and they run
    path = str(root / "usr" / "bin")
    for program in ("gpuflex-node", "gpuflex-tray"):
        found = shutil.which(program, path=path)
        assert found and os.access(found, os.X_OK), program
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = path + os.pathsep + env.get("PATH", "")
    out = subprocess.run(["gpuflex-node", "--version"], capture_output=True, text=True,
                         env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == f"gpuflex-node {version}", out

    entry_path = root / "usr" / "share" / "applications" / "gpuflex-tray.desktop"
    entry = configparser.ConfigParser(interpolation=None)
    entry.read(entry_path)
    assert entry["Desktop Entry"]["Exec"] == "gpuflex-tray"
    assert shutil.which(entry["Desktop Entry"]["Exec"], path=path)
    if shutil.which("desktop-file-validate"):  # desktop-file-utils (make system-deps)
        valid = subprocess.run(["desktop-file-validate", str(entry_path)],
                               capture_output=True, text=True)  # fmt: skip
        assert valid.returncode == 0, valid.stdout + valid.stderr
    icon = root / "usr" / "share" / "icons" / "hicolor" / "scalable" / "apps" / "gpuflex.svg"
    assert icon.is_file()
    unit = (root / "usr" / "lib" / "systemd" / "user" / "gpuflex-node.service").read_text()
    assert "ExecStart=/usr/bin/gpuflex-node run" in unit
    assert (root / "opt" / "gpuflex" / "update" / "packaged").read_text().strip() == "deb"

    gone = _dpkg(root, "--purge", "gpuflex")
    assert gone.returncode == 0, gone.stderr
    assert _files(root) == []  # every file the package installed is gone
    assert not (root / "opt" / "gpuflex").exists()
    assert not (root / "usr" / "share" / "applications").exists()
    assert "gpuflex" not in (root / "var" / "lib" / "dpkg" / "status").read_text()


def _small_bundle(folder: Path, version: str) -> Path:
    (folder / "_internal").mkdir(parents=True)
    (folder / "_internal" / "libpython.so").write_bytes(b"\0" * 4096)
    (folder / "VERSION").write_text(version + "\n")
    for program in ("gpuflex-node", "gpuflex-tray"):
        (folder / program).write_text(f'#!/bin/sh\necho "{program} {version}"\n')
        (folder / program).chmod(0o700)  # a umask-077 build: the package makes it 0755
    return folder


def test_deb_from_a_small_bundle_installs_runs_and_purges(tmp_path: Path) -> None:
    bundle = _small_bundle(tmp_path / "dist" / "gpuflex", "0.1.0")
    built = subprocess.run(
        [sys.executable, str(BUILD_DEB), "--bundle", str(bundle), "--out", str(tmp_path / "out"),
         "--compression", "gzip"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    deb = Path(built.stdout.strip())
    assert deb.name.startswith("gpuflex_0.1.0_") and deb.suffix == ".deb"
    listing = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    assert "root/root" in listing and "./opt/gpuflex/gpuflex-node" in listing
    tray = next(line for line in listing.splitlines() if line.endswith("/opt/gpuflex/gpuflex-tray"))
    assert tray.startswith("-rwxr-xr-x")
    _install_run_remove(deb, _fresh_root(tmp_path), "0.1.0")


def test_build_refuses_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    built = subprocess.run(
        [sys.executable, str(BUILD_DEB), "--bundle", str(tmp_path / "empty"), "--version", "1",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert built.returncode != 0 and "gpuflex-node is missing" in built.stderr
    assert not list((tmp_path / "out").glob("*.deb"))


@pytest.mark.skipif(not BUILT, reason="no .deb built (make package)")
def test_built_deb_installs_runs_and_purges(tmp_path: Path) -> None:
    from test_installers import runtime_files

    deb = BUILT[-1]
    version = deb.name.split("_")[1]
    # lean (#32): no torch or numpy inside; a task's runtime comes from a runtime pack
    listing = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    paths = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    assert any("libQt6Core" in p for p in paths) and runtime_files(paths) == []
    _install_run_remove(deb, _fresh_root(tmp_path), version)


CHROOT = os.environ.get("GPUFLEX_TEST_CHROOT", "")


@pytest.mark.skipif(
    not (BUILT and CHROOT and os.geteuid() == 0),
    reason="needs the built .deb, root, and GPUFLEX_TEST_CHROOT: a Debian root made by "
    "debootstrap (installers/README.md); apt in it fetches the package's Depends",
)
def test_built_deb_in_a_debian_chroot() -> None:
    root = Path(CHROOT)
    deb = BUILT[-1]

    def chroot(*cmd: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
               "HOME": "/root"}  # fmt: skip
        return subprocess.run(["chroot", str(root), *cmd], capture_output=True, text=True,
                              env=env, timeout=900)  # fmt: skip

    chroot("apt-get", "purge", "-y", "-qq", "gpuflex")  # a fresh start if an earlier run failed
    shutil.copyfile(deb, root / "tmp" / deb.name)
    try:
        done = chroot(
            "apt-get", "install", "-y", "-qq", "--no-install-recommends", f"/tmp/{deb.name}"
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        for program in ("gpuflex-node", "gpuflex-tray"):
            assert (
                chroot("sh", "-c", f"command -v {program}").stdout.strip() == f"/usr/bin/{program}"
            )
        out = chroot("gpuflex-node", "--version")
        assert out.returncode == 0 and out.stdout.startswith("gpuflex-node "), out.stderr
        assert (root / "usr/share/applications/gpuflex-tray.desktop").is_file()
    finally:
        (root / "tmp" / deb.name).unlink(missing_ok=True)
        gone = chroot("apt-get", "purge", "-y", "-qq", "gpuflex")
    assert gone.returncode == 0, gone.stderr
    assert not (root / "opt" / "gpuflex").exists()
    assert not (root / "usr" / "bin" / "gpuflex-node").exists()
    assert not (root / "usr/share/applications/gpuflex-tray.desktop").exists()
