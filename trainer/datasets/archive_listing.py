"""An image archive listed and checked without decoding an image, and without numpy, PIL or
torch, so a web request can refuse a bad archive at once (issue 36): names that could escape
a folder, links and special members, decompression bombs (member count, total bytes, ratio),
the class-folder layout, a member that is not an image by its suffix. archives.py reads the
images of an archive that passes (the module's docstring there says why).
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trainer.datasets.errors import (
    ARCHIVE_SUFFIXES,
    ArchiveLimits,
    ArchiveTooLarge,
    DatasetError,
    archive_suffix,
)

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif"})


@dataclass(frozen=True)
class _Member:
    name: str  # as stored in the archive
    parts: tuple[str, ...]  # its path, split
    size: int  # decompressed
    packed: int  # compressed size (zip), or the size again (tar: compression is archive-wide)


def check_image_archive(path: str | Path, limits: ArchiveLimits | None = None) -> int:
    """List and check an archive without decoding an image; the number of classes."""
    path = Path(path)
    limits = limits or ArchiveLimits()
    return len(_class_files(path, _list_members(path, limits), IMAGE_SUFFIXES))


# -- listing ---------------------------------------------------------------------------------


def _list_members(path: Path, limits: ArchiveLimits) -> list[_Member]:
    if not path.is_file():
        raise DatasetError(f"{path}: {'is not a file' if path.exists() else 'does not exist'}")
    suffix = archive_suffix(path.name)
    if suffix == ".zip":
        members = _zip_members(path, limits)
    elif suffix is not None:
        members = _tar_members(path, limits)
    else:
        raise DatasetError(f"{path.name}: not an image archive ({', '.join(ARCHIVE_SUFFIXES)})")
    total = sum(m.size for m in members)
    if total > limits.max_total_bytes:  # zip: declared sizes (tar stops before, in the loop)
        raise ArchiveTooLarge(
            f"{path.name}: the members hold {total} bytes decompressed; the limit is "
            f"{limits.max_total_bytes} bytes"
        )
    return members


def _zip_members(path: Path, limits: ArchiveLimits) -> list[_Member]:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise DatasetError(f"{path.name}: not a readable zip archive: {exc}") from None
    _check_count(path, len(infos), limits)
    members = []
    for info in infos:
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise DatasetError(f"{path.name}: member {info.filename!r} is a symbolic link")
        if info.flag_bits & 0x1:
            raise DatasetError(f"{path.name}: member {info.filename!r} is encrypted")
        parts = _safe_parts(path, info.filename)
        if info.is_dir() or parts is None:
            continue
        if info.file_size > limits.max_ratio * max(info.compress_size, 1) and (
            info.file_size > 1 << 20  # tiny members compress far legitimately (a blank BMP)
        ):
            raise ArchiveTooLarge(
                f"{path.name}: member {info.filename!r} decompresses from "
                f"{info.compress_size} to {info.file_size} bytes, beyond the ratio limit of "
                f"{limits.max_ratio:g} (a decompression bomb?)"
            )
        members.append(_Member(info.filename, parts, info.file_size, info.compress_size))
    return members


def _tar_members(path: Path, limits: ArchiveLimits) -> list[_Member]:
    # decompressing the tar stream to read its headers is bounded: the loop stops at the
    # member and byte limits, and at the ratio limit against the file's packed size
    packed = path.stat().st_size
    members: list[_Member] = []
    total = count = 0
    try:
        with tarfile.open(path, "r:*") as tf:
            for info in tf:
                count += 1
                _check_count(path, count, limits)
                if info.issym() or info.islnk():
                    raise DatasetError(f"{path.name}: member {info.name!r} is a link")
                if info.isdir():
                    _safe_parts(path, info.name)
                    continue
                if not info.isfile():
                    raise DatasetError(
                        f"{path.name}: member {info.name!r} is not a regular file (a device, "
                        "fifo or other special member)"
                    )
                parts = _safe_parts(path, info.name)
                total += info.size
                if total > limits.max_total_bytes:
                    raise ArchiveTooLarge(
                        f"{path.name}: the members hold more than {limits.max_total_bytes} "
                        "bytes decompressed (the limit)"
                    )
                if total > 1 << 20 and total > limits.max_ratio * packed:
                    raise ArchiveTooLarge(
                        f"{path.name}: {packed} bytes decompress to over {total} bytes, beyond "
                        f"the ratio limit of {limits.max_ratio:g} (a decompression bomb?)"
                    )
                if parts is not None:
                    members.append(_Member(info.name, parts, info.size, info.size))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(f"{path.name}: not a readable tar archive: {exc}") from None
    return members


def _check_count(path: Path, count: int, limits: ArchiveLimits) -> None:
    if count > limits.max_members:
        raise ArchiveTooLarge(f"{path.name}: more than {limits.max_members} members (the limit)")


def _safe_parts(path: Path, name: str) -> tuple[str, ...] | None:
    """The member's path parts; None for what is skipped (hidden files, __MACOSX); an
    error for a name that could leave the folder it would be unpacked in."""
    if "\0" in name:
        raise DatasetError(f"{path.name}: member {name!r} has a NUL byte in its name")
    unix = name.replace("\\", "/")
    if unix.startswith("/") or (len(unix) > 1 and unix[1] == ":"):
        raise DatasetError(f"{path.name}: member {name!r} has an absolute path")
    parts = tuple(p for p in PurePosixPath(unix).parts if p not in ("", "."))
    if ".." in parts:
        raise DatasetError(f"{path.name}: member {name!r} climbs out of its folder (..)")
    if not parts or any(p.startswith(".") or p == "__MACOSX" for p in parts):
        return None
    return parts


def _class_files(path: Path, members: list[_Member], suffixes: frozenset[str]) -> dict:
    """{class name: members, sorted by name}; a member outside the layout is an error."""
    depths = {len(m.parts) for m in members}
    tops = {m.parts[0] for m in members}
    # one top folder around the classes: data/<class>/<image>
    strip = 1 if depths == {3} and len(tops) == 1 else 0
    files: dict[str, list[_Member]] = {}
    seen: set[str] = set()
    for m in members:
        if m.name in seen:  # which of the two an unpacker keeps is up to the unpacker
            raise DatasetError(f"{path.name}: member {m.name!r} is in the archive twice")
        seen.add(m.name)
        parts = m.parts[strip:]
        if len(parts) != 2:
            raise DatasetError(f"{path.name}: member {m.name!r} is not <class folder>/<image file>")
        if PurePosixPath(parts[1]).suffix.lower() not in suffixes:
            raise DatasetError(
                f"{path.name}: member {m.name!r} is not an image ({', '.join(sorted(suffixes))})"
            )
        files.setdefault(parts[0], []).append(m)
    if len(files) < 2:
        found = f"only the class {next(iter(files))!r}" if files else "no images"
        raise DatasetError(
            f"{path.name}: {found}; an image archive holds at least 2 class folders "
            "(<class>/<image>)"
        )
    return {c: sorted(ms, key=lambda m: m.parts) for c, ms in files.items()}
