"""Build the .deb from a bundle folder (dist/gpuflex, made by the PyInstaller spec).

    python installers/linux/build_deb.py --bundle dist/gpuflex --out dist

Layout: the bundle in /opt/gpuflex; /usr/bin/gpuflex-node and /usr/bin/gpuflex-tray as
symlinks into it; the menu entry, its icon, and the systemd user unit. dpkg removes every
file it installed on `apt remove`; the agent's own files live in each user's home folder
(platformdirs), which packages never touch. No maintainer scripts: the desktop-file and
icon caches are refreshed by their own packages' dpkg triggers.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "gpuflex"
PREFIX = Path("opt") / PACKAGE
PROGRAMS = ("gpuflex-node", "gpuflex-tray")
# What the bundle does not carry: glibc (PyInstaller never bundles it) and the X/GL/font
# libraries Qt's xcb platform plugin loads from the system (the build warns for icccm, keysyms).
# The bundle's binaries need at least the glibc they were built against.
DEPENDS = (
    f"libc6 (>= {platform.libc_ver()[1] or '2.31'}), libgl1, libegl1, libfontconfig1, "
    "libxkbcommon0, libxkbcommon-x11-0, libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, libdbus-1-3"
)
RECOMMENDS = "bubblewrap"  # task isolation; without it tasks run with rlimits only


def _control(version: str, arch: str, installed_kib: int) -> str:
    return (
        f"Package: {PACKAGE}\n"
        f"Version: {version}\n"
        f"Architecture: {arch}\n"
        "Maintainer: GPUFlex <packages@gpuflex.io>\n"
        f"Installed-Size: {installed_kib}\n"
        f"Depends: {DEPENDS}\n"
        f"Recommends: {RECOMMENDS}\n"
        "Section: utils\n"
        "Priority: optional\n"
        "Homepage: https://github.com/gpuflex/gpuflex\n"
        "Description: GPUFlex contributor app: earn by training models on your GPU\n"
        " gpuflex-tray (the tray app) and gpuflex-node (the headless agent and CLI) in\n"
        " one self-contained bundle with its own Python, PyTorch and Qt.\n"
    )


def _normalise_modes(root: Path) -> None:
    # the bundle may come from a umask-077 build: files 0644, executables and folders 0755
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        executable = path.is_dir() or path.stat().st_mode & 0o111
        path.chmod(0o755 if executable else 0o644)


def _du_kib(root: Path) -> int:
    total = sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() or p.is_symlink())
    return max(1, total // 1024)


def stage(bundle: Path, root: Path, version: str, arch: str) -> None:
    """Lay out the package's files under `root` (the future /)."""
    for program in PROGRAMS:
        if not (bundle / program).is_file():
            raise SystemExit(f"{bundle} is not a bundle: {program} is missing (make package)")
    shutil.copytree(bundle, root / PREFIX, symlinks=True)
    # a system install is updated by apt, never by the bundle's own updater (desktop/updater.py)
    (root / PREFIX / "update").mkdir(exist_ok=True)
    (root / PREFIX / "update" / "packaged").write_text("deb\n")
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    for program in PROGRAMS:
        # relative, so that the links also resolve inside a dpkg --root or a chroot
        (bin_dir / program).symlink_to(Path("..") / ".." / PREFIX / program)
    apps = root / "usr" / "share" / "applications"
    apps.mkdir(parents=True)
    shutil.copyfile(HERE / "gpuflex-tray.desktop", apps / "gpuflex-tray.desktop")
    icons = root / "usr" / "share" / "icons" / "hicolor" / "scalable" / "apps"
    icons.mkdir(parents=True)
    shutil.copyfile(HERE / "gpuflex.svg", icons / "gpuflex.svg")
    units = root / "usr" / "lib" / "systemd" / "user"
    units.mkdir(parents=True)
    unit = (HERE / "gpuflex-node.service").read_text()
    unit = unit.replace("ExecStart=%h/.local/bin/gpuflex-node", "ExecStart=/usr/bin/gpuflex-node")
    (units / "gpuflex-node.service").write_text(unit)
    _normalise_modes(root)
    debian = root / "DEBIAN"
    debian.mkdir()
    (debian / "control").write_text(_control(version, arch, _du_kib(root)))
    (debian / "control").chmod(0o644)


def build(
    bundle: Path, out_dir: Path, version: str | None = None, compression: str = "zstd"
) -> Path:
    version = version or (bundle / "VERSION").read_text().strip()
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"{PACKAGE}_{version}_{arch}.deb"
    with tempfile.TemporaryDirectory(prefix="gpuflex-deb-", dir=out_dir) as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        stage(bundle, root, version, arch)
        subprocess.run(
            ["dpkg-deb", "--build", "--root-owner-group", f"-Z{compression}", str(root), str(deb)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return deb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("dist") / "gpuflex")
    p.add_argument("--out", type=Path, default=Path("dist"))
    p.add_argument("--version", help="default: the bundle's VERSION file")
    # zstd: dpkg reads it from Debian 12 and Ubuntu 21.10 on, and packs a 900 MB bundle in
    # seconds where xz takes half an hour on two busy cores; --compression xz for older ones
    p.add_argument("--compression", default="zstd", choices=("xz", "gzip", "zstd", "none"))
    args = p.parse_args(argv)
    os.umask(0o022)
    print(build(args.bundle.resolve(), args.out.resolve(), args.version, args.compression))
    return 0


if __name__ == "__main__":
    sys.exit(main())
