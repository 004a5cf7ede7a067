"""The AppImage: our type-2 runtime (installers/linux/runtime/runtime.c) with a squashfs image of
an AppDir appended. A tiny AppDir runs in `make test`; the real GPUFlex AppImage when
`make package` built it.

The runtime is built from source here (gcc, Debian's libsquashfuse-dev and friends); without
them the tests skip, naming the missing package.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "dist" / f"GPUFlex-{platform.machine()}.AppImage"

_spec = importlib.util.spec_from_file_location(
    "build_appdir", ROOT / "installers" / "linux" / "build_appdir.py"
)
assert _spec and _spec.loader
build_appdir = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_appdir)

MISSING = build_appdir.runtime_missing() if platform.system() == "Linux" else "not Linux"
needs_runtime = pytest.mark.skipif(MISSING is not None, reason=f"AppImage runtime: {MISSING}")

# prints what the runtime gave it, and reads files from the image (through a symlink, and one
# of several blocks) so that the FUSE mount is read, not only listed
APPRUN = """#!/bin/sh
echo "args: $*"
echo "appdir: $APPDIR"
echo "argv0: $ARGV0"
cat "$APPDIR/usr/lib/private"
sha256sum "$APPDIR/usr/share/big" | cut -d' ' -f1
"""
BIG = os.urandom(300_000)
DESKTOP = (
    "[Desktop Entry]\nType=Application\nName=Tiny\nExec=tiny\nIcon=tiny\nCategories=Utility;\n"
)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.pop("APPIMAGE_EXTRACT_AND_RUN", None)
    env["TMPDIR"] = str(tmp)  # where the runtime makes its mount point or extraction folder
    return env


def _run(cmd: list[str], tmp: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(tmp), cwd=cwd,
                          timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if MISSING:
        pytest.skip(f"AppImage runtime: {MISSING}")
    return build_appdir.build_runtime(tmp_path_factory.mktemp("runtime") / "runtime")


@pytest.fixture(scope="module")
def appdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    appdir = tmp_path_factory.mktemp("tiny") / "Tiny.AppDir"
    (appdir / "usr" / "share").mkdir(parents=True)
    (appdir / "AppRun").write_text(APPRUN)
    (appdir / "AppRun").chmod(0o755)
    (appdir / "tiny.desktop").write_text(DESKTOP)
    shutil.copyfile(ROOT / "installers" / "linux" / "gpuflex.svg", appdir / "tiny.svg")
    (appdir / ".DirIcon").symlink_to("tiny.svg")
    (appdir / "usr" / "share" / "private").write_text("0640\n")
    (appdir / "usr" / "share" / "private").chmod(0o640)
    (appdir / "usr" / "share" / "big").write_bytes(BIG)  # several squashfs blocks
    (appdir / "usr" / "lib").symlink_to("share")
    return appdir


@pytest.fixture(scope="module")
def appimage(runtime: Path, appdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_appdir.build_appimage(appdir, runtime, tmp_path_factory.mktemp("out"))


def _tree(root: Path) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry under root: its type, permission bits, and content or link target."""
    tree: dict[str, tuple[str, int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            tree[rel] = ("link", 0, os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            tree[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
        else:
            tree[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return tree


@needs_runtime
def test_header_magic_and_offset(runtime: Path, appimage: Path, tmp_path: Path) -> None:
    head = appimage.read_bytes()[:64]
    assert head[:4] == b"\x7fELF" and head[8:11] == b"AI\x02"  # the spec's type-2 magic
    # the image starts where the ELF ends: after its section header table
    e_shoff, e_shentsize, e_shnum = struct.unpack_from("<Q", head, 0x28) + struct.unpack_from(
        "<HH", head, 0x3A
    )
    end = e_shoff + e_shentsize * e_shnum
    assert end == runtime.stat().st_size
    shown = _run([str(appimage), "--appimage-offset"], tmp_path)
    assert shown.returncode == 0 and shown.stdout.strip() == str(end)
    with appimage.open("rb") as f:
        f.seek(end)
        assert f.read(4) == b"hsqs"  # squashfs superblock magic
    version = _run([str(appimage), "--appimage-version"], tmp_path)
    assert "AppImage type 2" in version.stdout
    unknown = _run([str(appimage), "--appimage-nonsense"], tmp_path)
    assert unknown.returncode != 0 and "unknown option --appimage-nonsense" in unknown.stderr


@needs_runtime
def test_extract_and_run_passes_arguments_and_cleans_up(
    runtime: Path, appimage: Path, tmp_path: Path
) -> None:
    out = _run([str(appimage), "--appimage-extract-and-run", "a", "b c"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "args: a b c"
    assert lines[1].startswith(f"appdir: {tmp_path}/appimage_extracted_")
    assert lines[2] == f"argv0: {appimage}"
    assert lines[3:] == ["0640", hashlib.sha256(BIG).hexdigest()]
    assert list(tmp_path.iterdir()) == []  # the extracted copy is gone

    # AppRun's exit status is the AppImage's
    failing = tmp_path / "Failing.AppDir"
    failing.mkdir()
    (failing / "AppRun").write_text("#!/bin/sh\nexit 3\n")
    (failing / "AppRun").chmod(0o755)
    image = build_appdir.build_appimage(failing, runtime, tmp_path)
    shutil.rmtree(failing)
    assert _run([str(image), "--appimage-extract-and-run"], tmp_path).returncode == 3


@needs_runtime
def test_extract_reproduces_the_appdir(appimage: Path, appdir: Path, tmp_path: Path) -> None:
    out = _run([str(appimage), "--appimage-extract"], tmp_path, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    extracted = tmp_path / "squashfs-root"
    assert _tree(extracted) == _tree(appdir)
    # again over the existing tree: replaced, same result
    again = _run([str(appimage), "--appimage-extract"], tmp_path, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert _tree(extracted) == _tree(appdir)


@needs_runtime
def test_extract_a_glob(appimage: Path, tmp_path: Path) -> None:
    out = _run([str(appimage), "--appimage-extract", "*.desktop"], tmp_path, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "squashfs-root").iterdir()) == ["tiny.desktop"]


@needs_runtime
def test_extract_does_not_follow_a_planted_squashfs_root(appimage: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "squashfs-root").symlink_to(tmp_path / "elsewhere")
    out = _run([str(appimage), "--appimage-extract"], tmp_path, cwd=tmp_path / "work")
    assert out.returncode != 0
    assert list((tmp_path / "elsewhere").iterdir()) == []


@needs_runtime
def test_plain_run_mounts_with_fuse(appimage: Path, tmp_path: Path) -> None:
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse: the plain run needs FUSE")
    out = _run([str(appimage), "x", "y"], tmp_path)
    if out.returncode != 0 and "cannot mount the AppImage with FUSE" in out.stderr:
        pytest.skip(f"FUSE mounting is refused here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "args: x y"
    assert lines[3:] == ["0640", hashlib.sha256(BIG).hexdigest()]  # read through FUSE
    mount_point = lines[1].removeprefix("appdir: ")
    assert mount_point.startswith(f"{tmp_path}/.mount_")
    assert mount_point not in Path("/proc/self/mounts").read_text()  # unmounted after
    assert list(tmp_path.iterdir()) == []  # and its folder removed


@needs_runtime
@pytest.mark.parametrize("mode", ["fuse", "extract-and-run"])
def test_sigterm_reaches_apprun_and_the_runtime_cleans_up(
    runtime: Path, tmp_path: Path, mode: str
) -> None:
    sleeper = tmp_path / "Sleeper.AppDir"
    sleeper.mkdir()
    (sleeper / "AppRun").write_text('#!/bin/sh\necho "$APPDIR"\nexec sleep 600\n')
    (sleeper / "AppRun").chmod(0o755)
    image = build_appdir.build_appimage(sleeper, runtime, tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cmd = [str(image)] if mode == "fuse" else [str(image), "--appimage-extract-and-run"]
    # its own session, so that a failing run leaves no AppRun behind (killpg below)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(run_dir), start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout
        appdir = proc.stdout.readline().strip()  # AppRun is running once it has printed this
        if not appdir and mode == "fuse":
            pytest.skip(f"FUSE mounting is refused here: {proc.communicate(timeout=60)[1]}")
        proc.terminate()  # SIGTERM to the runtime, which passes it on to AppRun
        proc.wait(timeout=60)  # a hang guard only
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == 128 + 15  # AppRun's status: killed by SIGTERM
    assert appdir.startswith(str(run_dir))
    assert appdir not in Path("/proc/self/mounts").read_text()
    assert list(run_dir.iterdir()) == []  # mount point or extracted copy removed


def _fuse_closed_to_others() -> bool:
    fuse = Path("/dev/fuse")
    return not fuse.exists() or fuse.stat().st_mode & 0o006 == 0


@needs_runtime
@pytest.mark.skipif(
    not (os.geteuid() == 0 and shutil.which("setpriv") and _fuse_closed_to_others()),
    reason="needs root and setpriv to run as nobody, for whom /dev/fuse is closed",
)
def test_without_fuse_it_says_so_and_extract_and_run_works(appimage: Path) -> None:
    # as nobody, with /dev/fuse root-only (as in this container): the FUSE path fails, and
    # the message names the way out; the folder has a space (the spec: MUST work)
    folder = Path(tempfile.mkdtemp(prefix="gpuflex appimage "))
    try:
        folder.chmod(0o1777)
        copy = folder / "Tiny App.AppImage"
        shutil.copyfile(appimage, copy)
        copy.chmod(0o755)
        nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        out = _run([*nobody, str(copy), "a"], folder, cwd=folder)
        assert out.returncode == 1 and out.stdout == ""
        assert "cannot mount the AppImage with FUSE" in out.stderr
        assert f"{copy} --appimage-extract-and-run" in out.stderr
        assert sorted(p.name for p in folder.iterdir()) == [copy.name]  # no mount folder left

        env_run = [*nobody, "env", "APPIMAGE_EXTRACT_AND_RUN=1", str(copy), "a"]
        out = _run(env_run, folder, cwd=folder)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == "args: a"
        assert sorted(p.name for p in folder.iterdir()) == [copy.name]
    finally:
        shutil.rmtree(folder)


def _hostile_image(tmp_path: Path, runtime: Path, patch: dict[bytes, bytes]) -> Path:
    """An AppImage whose squashfs was edited after mksquashfs: with uncompressed metadata the
    names lie as plain bytes in the directory table, so same-length renames craft what
    mksquashfs would never write (a name with '/' or '..', two entries with one name)."""
    src = tmp_path / "src"
    (src / "aaab").mkdir(parents=True)
    (src / "QQQQQQQQ").write_text("pwned\n")
    (src / "aaab" / "f").write_text("pwned\n")
    (tmp_path / "outside").mkdir()
    (src / "aaaa").symlink_to(tmp_path / "outside")  # absolute, out of the target
    image = tmp_path / "img"
    subprocess.run(["mksquashfs", str(src), str(image), "-noappend", "-comp", "gzip", "-noI",
                    "-noD", "-noF", "-noX", "-quiet", "-no-progress"], check=True)  # fmt: skip
    data = image.read_bytes()
    for old, new in patch.items():
        assert data.count(old) == 1, old  # the name is there once, uncompressed
        data = data.replace(old, new)
    hostile = tmp_path / "hostile.AppImage"
    hostile.write_bytes(runtime.read_bytes() + data)
    hostile.chmod(0o755)
    return hostile


@needs_runtime
@pytest.mark.parametrize(
    "patch, refusal",
    [
        ({b"QQQQQQQQ": b"../pwned"}, 'refusing to extract "../pwned"'),
        # a folder named like the symlink before it: its file must not land in "outside"
        ({b"aaab": b"aaaa", b"QQQQQQQQ": b"QQQQQQQR"}, "cannot extract aaaa: Not a directory"),
    ],
    ids=["dotdot-name", "dir-through-symlink"],
)
def test_hostile_image_writes_nothing_outside(
    runtime: Path, tmp_path: Path, patch: dict[bytes, bytes], refusal: str
) -> None:
    hostile = _hostile_image(tmp_path, runtime, patch)
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    out = _run([str(hostile), "--appimage-extract"], tmp_path, cwd=work)
    assert out.returncode != 0 and refusal in out.stderr, out.stderr
    assert list((tmp_path / "outside").iterdir()) == []
    assert sorted(p.name for p in work.iterdir()) == ["squashfs-root"]
    assert not (tmp_path / "work" / "pwned").exists()
    assert not any(p.name in {"pwned", "f"} for p in (work / "squashfs-root").rglob("*"))


@pytest.mark.skipif(not BUILT.exists(), reason="no AppImage built (make package)")
def test_built_appimage_runs_without_fuse(tmp_path: Path) -> None:
    node = _run([str(BUILT), "--appimage-extract-and-run", "node", "--version"], tmp_path)
    assert node.returncode == 0, node.stderr
    assert node.stdout.strip().startswith("gpuflex-node ")
    tray = _run([str(BUILT), "--appimage-extract-and-run", "--version"], tmp_path)
    assert tray.returncode == 0 and "gpuflex-tray" in tray.stdout, tray.stderr
    assert list(tmp_path.iterdir()) == []
