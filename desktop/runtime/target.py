"""Which platform and Python a runtime pack is for: this machine's, the one a pack's manifest
names, and the one its wheels were actually built for.

Platforms are compared as families, `<os>_<arch>`: `linux_x86_64` (manylinux_2_28_x86_64,
manylinux2014_x86_64 and linux_x86_64 wheels all run on it), `macosx_arm64` (macosx_11_0_arm64,
macosx_14_0_arm64 and universal2 wheels), `win_amd64`. The macOS version a wheel needs is not
part of the family (sysconfig's macOS tag is the version the interpreter was built for, not
the one it runs on); a pack's manifest names the newest one its wheels need as `min_os`.

A pack can be built on another machine than the one it is for (scripts/build-runtime-pack.sh
builds `mps` on Linux), so the build checks what the manifest will claim against the wheels:
their `*.dist-info/WHEEL` tags and torch's own compiled extension (`torch/_C.cpython-311-
darwin.so`), and refuses a pack that says one platform and holds another.
"""

from __future__ import annotations

import platform
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

UNIVERSAL_MAC_ARCHS = ("arm64", "x86_64")  # what a macOS universal2 wheel holds


def python_tag() -> str:
    """This interpreter's tag: "cp311"."""
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def platform_family(tag: str) -> str:
    """One wheel platform tag (or sysconfig's platform) as its family: 'macosx_14_0_arm64'
    -> 'macosx_arm64', 'manylinux_2_28_x86_64' -> 'linux_x86_64', 'win_amd64' -> itself."""
    tag = tag.replace("-", "_").replace(".", "_")
    if m := re.fullmatch(r"macosx_\d+_\d+_(\w+)", tag):
        return f"macosx_{m.group(1)}"
    if m := re.fullmatch(r"manylinux(?:1|2010|2014|_\d+_\d+)_(\w+)", tag):
        return f"linux_{m.group(1)}"
    if m := re.fullmatch(r"musllinux_\d+_\d+_(\w+)", tag):
        return f"musllinux_{m.group(1)}"
    return tag


def platform_tag() -> str:
    """This machine's platform family: 'linux_x86_64', 'macosx_arm64', 'win_amd64'."""
    family = platform_family(sysconfig.get_platform())
    if family in ("macosx_universal2", "macosx_intel"):  # a universal interpreter: the CPU's
        family = f"macosx_{platform.machine()}"
    return family


def families(platform_part: str) -> set[str]:
    """The families a wheel's platform part runs on ('any': every one, as the empty set; a
    compressed 'manylinux_2_17_x86_64.manylinux2014_x86_64' is one family)."""
    out: set[str] = set()
    for tag in platform_part.split("."):
        family = platform_family(tag)
        if family == "any":
            continue
        if family == "macosx_universal2":
            out |= {f"macosx_{arch}" for arch in UNIVERSAL_MAC_ARCHS}
        else:
            out.add(family)
    return out


def python_fits(wheel_python: str, abi: str, python: str) -> bool:
    """Whether a wheel's python/abi tags load in interpreter `python` ('cp311'): its own
    cp311, a stable-ABI cp3X-abi3 with X <= 11, or pure Python."""
    want = int(python[2:]) if python.startswith("cp") and python[2:].isdigit() else -1
    for py in wheel_python.split("."):
        if py in (python, "py3", "py2.py3") or py.startswith("py3"):
            return True
        if abi == "abi3" and py.startswith("cp3") and py[2:].isdigit() and int(py[2:]) <= want:
            return True
    return False


@dataclass(frozen=True)
class Found:
    """What a site-packages folder's compiled contents were built for."""

    platforms: dict[str, set[str]]  # what (a wheel, torch's extension) -> its families
    pythons: dict[str, str]  # what -> a python tag it does not fit (only misfits)
    min_macos: str  # the newest macOS version a wheel's tag names; "" for none


# torch's compiled core: _C.cpython-311-darwin.so / -x86_64-linux-gnu.so / _C.cp311-win_amd64.pyd
_EXT = re.compile(r"_C\.(?:cpython-(\d+)-([\w-]+)\.so|cp(\d+)-(\w+)\.pyd)$")


def _extension_family(os_part: str) -> set[str]:
    if os_part == "darwin":  # the suffix names no CPU: torch/lib's dylibs are macOS, not which
        return {f"macosx_{arch}" for arch in UNIVERSAL_MAC_ARCHS}
    if m := re.fullmatch(r"(\w+)-linux-(?:gnu|musl)", os_part):
        return {f"linux_{m.group(1)}"}
    return {os_part}  # "win_amd64"


def inspect(site: Path, python: str) -> Found:
    platforms: dict[str, set[str]] = {}
    misfits: dict[str, str] = {}
    min_macos = (0, 0)
    for wheel in sorted(site.glob("*.dist-info/WHEEL")):
        name = wheel.parent.name.removesuffix(".dist-info")
        tags = [line.partition(":")[2].strip() for line in wheel.read_text(errors="replace")
                .splitlines() if line.startswith("Tag:")]  # fmt: skip
        # a wheel with several tags (py2-none-any and py3-none-any) fits where any one does
        parts = [[*t.split("-"), "", "", ""][:3] for t in tags]
        fams = [families(plat) for _, _, plat in parts]
        if parts and all(fams):  # no pure-Python tag among them
            platforms[f"{name} ({', '.join(tags)})"] = set().union(*fams)
        if parts and not any(python_fits(py, abi, python) for py, abi, _ in parts):
            misfits[f"{name} ({', '.join(tags)})"] = parts[0][0]
        for _, _, plat in parts:
            for m in re.finditer(r"macosx_(\d+)_(\d+)_", plat):
                min_macos = max(min_macos, (int(m.group(1)), int(m.group(2))))
    for ext in sorted((site / "torch").glob("_C.*")):
        if m := _EXT.search(ext.name):
            version, os_part = (m.group(1), m.group(2)) if m.group(1) else m.group(3, 4)
            what = f"torch/{ext.name}"
            platforms[what] = _extension_family(os_part)
            if f"cp{version}" != python:
                misfits[what] = f"cp{version}"
    macos = f"{min_macos[0]}.{min_macos[1]}" if min_macos != (0, 0) else ""
    return Found(platforms, misfits, macos)


def check(site: Path, platform_: str, python: str) -> Found:
    """What `site` holds, refusing it (ValueError, saying which file) unless every compiled
    wheel and torch's own extension are for `platform_` and `python`. A pack for another
    machine than this one must show at least one: an unverifiable claim is refused too."""
    found = inspect(site, python)
    wrong = {what: fams for what, fams in found.platforms.items() if platform_ not in fams}
    if wrong:
        what, fams = next(iter(sorted(wrong.items())))
        raise ValueError(
            f"the pack is to be for {platform_}, but {what} is built for "
            f"{' or '.join(sorted(fams))} ({len(wrong)} such file(s)): install the wheels for "
            f"{platform_} (pip/uv --platform) or build the pack for what they are"
        )
    if found.pythons:
        what, py = next(iter(sorted(found.pythons.items())))
        raise ValueError(
            f"the pack is to be for {python}, but {what} is built for {py} "
            f"({len(found.pythons)} such file(s))"
        )
    if not found.platforms and platform_ != platform_tag():
        raise ValueError(
            f"nothing in {site} shows which platform it is built for (no compiled wheel's "
            f"*.dist-info/WHEEL, no torch/_C extension): it cannot be packed as {platform_} "
            f"on this {platform_tag()} machine"
        )
    return found


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2]) or (0,)


def runs_here(manifest_platform: str, manifest_python: str, min_os: str = "") -> str:
    """'' when a pack for this platform, python (and oldest macOS) runs here, else why not,
    naming both platforms."""
    here_platform, here_python = platform_tag(), python_tag()
    if platform_family(manifest_platform) != here_platform or manifest_python != here_python:
        return (
            f"built for {manifest_python} {manifest_platform}; this agent runs "
            f"{here_python} {here_platform}"
        )
    mac = platform.mac_ver()[0] if here_platform.startswith("macosx") else ""
    if min_os and mac and _version(mac) < _version(min_os):
        return f"built for macOS {min_os} or newer; this Mac runs macOS {mac}"
    return ""
