"""Build the AppImage's AppDir from a bundle folder (dist/gpuflex), and the AppImage if the
AppImage runtime is at hand.

    python installers/linux/build_appdir.py --bundle dist/gpuflex --out dist
    python installers/linux/build_appdir.py ... --runtime runtime-x86_64   # + GPUFlex.AppImage

A type-2 AppImage is the AppImage runtime (a small static ELF that mounts or extracts what
follows it) with a squashfs image of the AppDir appended. The runtime is not packaged by
Debian or PyPI (appimagetool and the `appimage` PyPI tools download it from GitHub at run
time), so without `--runtime` this stops at the AppDir, which AppRun runs the same way the
AppImage's `--appimage-extract-and-run` would (installers/README.md).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "GPUFlex"

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


def build_appimage(appdir: Path, runtime: Path, out_dir: Path) -> Path:
    """runtime + squashfs(AppDir): the type-2 AppImage format."""
    image = out_dir / f"{NAME}.squashfs"
    image.unlink(missing_ok=True)
    subprocess.run(
        ["mksquashfs", str(appdir), str(image), "-root-owned", "-noappend", "-comp", "zstd",
         "-quiet"],
        check=True,
    )  # fmt: skip
    appimage = out_dir / f"{NAME}-x86_64.AppImage"
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
    p.add_argument("--runtime", type=Path, help="the AppImage type-2 runtime for this arch")
    args = p.parse_args(argv)
    appdir = build_appdir(args.bundle.resolve(), args.out.resolve())
    print(appdir)
    if args.runtime:
        print(build_appimage(appdir, args.runtime, args.out.resolve()))
    else:
        print("no --runtime: AppImage not assembled (the runtime is not packaged here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
