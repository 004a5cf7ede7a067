"""Build the AppImage's AppDir from a bundle folder (dist/gpuflex), then the AppImage.

    python installers/linux/build_appdir.py --bundle dist/gpuflex --out dist
    python installers/linux/build_appdir.py ... --runtime runtime-x86_64   # a given runtime

A type-2 AppImage is the AppImage runtime (a small ELF that mounts or extracts what follows
it) with a squashfs image of the AppDir appended. The official runtime is published only on
GitHub, so without `--runtime` this builds our own (installers/linux/runtime/runtime.c, on
Debian's libsquashfuse) when gcc and the libraries are here; otherwise it stops at the
AppDir and says which package is missing (installers/README.md).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "GPUFlex"
RUNTIME_BUILD = HERE / "runtime" / "build.sh"
# what building the runtime and the image needs: library (for gcc -l) -> Debian package
RUNTIME_LIBS = {
    "squashfuse_ll": "libsquashfuse-dev",
    "fuse3": "libfuse3-dev",
    "zstd": "libzstd-dev",
    "z": "zlib1g-dev",
    "lzma": "liblzma-dev",
    "lz4": "liblz4-dev",
}

# AppRun: the tray app by default; `GPUFlex.AppImage node ARGS` (or a symlink named
# gpuflex-node, which the runtime passes as $ARGV0) runs the agent's CLI.
APPRUN = """#!/bin/sh
HERE="$(dirname "$(readlink -f "$0")")"
case "$(basename "${ARGV0:-$0}")" in
  gpuflex-node*) exec "$HERE/usr/lib/gpuflex/gpuflex-node" "$@" ;;
esac
if [ "$1" = node ]; then shift; exec "$HERE/usr/lib/gpuflex/gpuflex-node" "$@"; fi
exec "$HERE/usr/lib/gpuflex/gpuflex-tray" "$@"
"""


def build_appdir(bundle: Path, out_dir: Path) -> Path:
    for program in ("gpuflex-node", "gpuflex-tray"):
        if not (bundle / program).is_file():
            raise SystemExit(f"{bundle} is not a bundle: {program} is missing (make package)")
    appdir = out_dir / f"{NAME}.AppDir"
    shutil.rmtree(appdir, ignore_errors=True)
    shutil.copytree(bundle, appdir / "usr" / "lib" / "gpuflex", symlinks=True)
    (appdir / "AppRun").write_text(APPRUN)
    (appdir / "AppRun").chmod(0o755)
    shutil.copyfile(HERE / "gpuflex-tray.desktop", appdir / "gpuflex.desktop")
    shutil.copyfile(HERE / "gpuflex.svg", appdir / "gpuflex.svg")
    (appdir / ".DirIcon").symlink_to("gpuflex.svg")
    return appdir


def runtime_missing() -> str | None:
    """Why our runtime cannot be built here (naming the Debian package), or None."""
    for tool, package in (("gcc", "gcc"), ("mksquashfs", "squashfs-tools")):
        if not shutil.which(tool):
            return f"{tool} not found (Debian package {package})"
    if not Path("/usr/include/squashfuse/ll.h").is_file():
        return "squashfuse's headers not found (Debian package libsquashfuse-dev)"
    for lib, package in RUNTIME_LIBS.items():
        found = [
            subprocess.run(["gcc", f"-print-file-name=lib{lib}.{ext}"], capture_output=True,
                           text=True).stdout.strip()
            for ext in ("a", "so")
        ]  # fmt: skip
        if not any(path.startswith("/") for path in found):  # gcc echoes the name if not found
            return f"lib{lib} not found (Debian package {package})"
    return None


def build_runtime(out: Path) -> Path:
    """Compile runtime/runtime.c into `out` (runtime/build.sh; see runtime_missing)."""
    subprocess.run([str(RUNTIME_BUILD), str(out)], check=True)
    return out


def build_appimage(appdir: Path, runtime: Path, out_dir: Path) -> Path:
    """runtime + squashfs(AppDir): the type-2 AppImage format."""
    image = out_dir / f"{NAME}.squashfs"
    image.unlink(missing_ok=True)
    subprocess.run(
        ["mksquashfs", str(appdir), str(image), "-root-owned", "-noappend", "-comp", "zstd",
         "-quiet", "-no-progress"],
        check=True,
    )  # fmt: skip
    appimage = out_dir / f"{NAME}-{platform.machine()}.AppImage"
    with appimage.open("wb") as out:
        out.write(runtime.read_bytes())
        with image.open("rb") as payload:
            shutil.copyfileobj(payload, out)
    appimage.chmod(0o755)
    image.unlink()
    return appimage


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("dist") / "gpuflex")
    p.add_argument("--out", type=Path, default=Path("dist"))
    p.add_argument("--runtime", type=Path, help="a type-2 runtime (default: build ours)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    appdir = build_appdir(args.bundle.resolve(), out)
    print(appdir)
    if args.runtime:
        print(build_appimage(appdir, args.runtime, out))
    elif missing := runtime_missing():
        print(f"AppImage not assembled: cannot build the AppImage runtime: {missing}")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            runtime = build_runtime(Path(tmp) / "runtime")
            print(build_appimage(appdir, runtime, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
