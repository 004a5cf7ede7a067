"""The AppImage's AppDir (installers/linux/build_appdir.py): AppRun starts either program.

build_appdir.py also assembles the AppImage with our runtime when it can build it (gcc and
Debian's libsquashfuse-dev and friends), and says which package is missing when it cannot;
the runtime itself is tested in test_appimage.py.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "installers" / "linux" / "build_appdir.py"
BUILT = ROOT / "dist" / "GPUFlex.AppDir"

_spec = importlib.util.spec_from_file_location("build_appdir", BUILD)
assert _spec and _spec.loader
build_appdir = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_appdir)


def _run(appdir: Path, *args: str, argv0: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if argv0:
        env["ARGV0"] = argv0  # what the AppImage runtime sets for a symlinked AppImage
    out = subprocess.run([str(appdir / "AppRun"), *args], capture_output=True, text=True,
                         env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _check_appdir(appdir: Path) -> None:
    entry = configparser.ConfigParser(interpolation=None)
    entry.read(appdir / "gpuflex.desktop")
    assert entry["Desktop Entry"]["Icon"] == "gpuflex"
    assert (appdir / "gpuflex.svg").is_file() and (appdir / ".DirIcon").resolve().is_file()
    if shutil.which("desktop-file-validate"):
        valid = subprocess.run(["desktop-file-validate", str(appdir / "gpuflex.desktop")],
                               capture_output=True, text=True)  # fmt: skip
        assert valid.returncode == 0, valid.stdout


def test_appdir_from_a_small_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "gpuflex"
    bundle.mkdir()
    for program in ("gpuflex-node", "gpuflex-tray"):
        (bundle / program).write_text(f'#!/bin/sh\necho "{program} $*"\n')
        (bundle / program).chmod(0o755)
    done = subprocess.run([sys.executable, str(BUILD), "--bundle", str(bundle),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    appdir = tmp_path / "out" / "GPUFlex.AppDir"
    _check_appdir(appdir)
    assert _run(appdir, "--x") == "gpuflex-tray --x"
    assert _run(appdir, "node", "status") == "gpuflex-node status"
    assert _run(appdir, "info", argv0="/home/u/bin/gpuflex-node") == "gpuflex-node info"

    appimage = tmp_path / "out" / f"GPUFlex-{platform.machine()}.AppImage"
    missing = build_appdir.runtime_missing()
    if missing:  # no runtime: said, with the missing package, not faked
        assert (
            f"AppImage not assembled: cannot build the AppImage runtime: {missing}" in done.stdout
        )
        assert not appimage.exists()
    else:
        assert done.stdout.splitlines()[-1] == str(appimage)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        ran = subprocess.run([str(appimage), "--appimage-extract-and-run", "node", "status"],
                             capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert ran.returncode == 0 and ran.stdout.strip() == "gpuflex-node status", ran.stderr


@pytest.mark.skipif(not BUILT.exists(), reason="no AppDir built (make package)")
def test_built_appdir_starts_both_programs() -> None:
    from test_installers import runtime_files

    _check_appdir(BUILT)
    files = [p.relative_to(BUILT).as_posix() for p in BUILT.rglob("*") if p.is_file()]
    assert runtime_files(files) == []  # lean (#32): tasks run from a runtime pack
    assert _run(BUILT, "node", "--version").startswith("gpuflex-node ")
    assert "gpuflex-tray" in _run(BUILT, "--version")
