"""Image datasets packed in one archive: a zip or tar (.tar, .tar.gz, .tgz) of class folders.

An archive usually comes from someone else (a marketplace buyer), so nothing in it is ever
extracted to disk: members are listed first and the whole archive is refused before any
image is decoded when a name could escape a folder (.., an absolute path, a drive letter), a
member is not a plain file (tar links, devices, fifos), or the sizes say it is a
decompression bomb (too many members, too many bytes once decompressed, or a member that
decompresses too far beyond its packed size). Images are then read from memory, each one's
pixel count checked from its header before Pillow decodes it (Pillow's own
DecompressionBombError is the second line). A member that is not an image is an error
naming it, as is an archive with fewer than two classes.

Layout: `<class>/<image>`, or the same inside one top folder (`data/<class>/<image>`, what
zipping a folder gives). Hidden files and folders (.DS_Store, __MACOSX) are skipped.
"""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, UnidentifiedImageError

from trainer.datasets.base import Dataset
from trainer.datasets.classification import classification_dataset
from trainer.datasets.errors import (
    ARCHIVE_SUFFIXES,
    ArchiveLimits,
    ArchiveTooLarge,
    DatasetError,
    archive_suffix,
)
from trainer.datasets.pixels import IMAGE_SUFFIXES, stack_images, to_array

_FORMATS = ("PNG", "JPEG", "BMP", "GIF")  # IMAGE_SUFFIXES' formats


@dataclass(frozen=True)
class _Member:
    name: str  # as stored in the archive
    parts: tuple[str, ...]  # its path, split
    size: int  # decompressed
    packed: int  # compressed size (zip), or the size again (tar: compression is archive-wide)


def load_image_archive(
    path: str | Path,
    image_size: int = 28,
    test_fraction: float = 0.2,
    seed: int = 0,
    limits: ArchiveLimits | None = None,
) -> Dataset:
    """The archive's images as load_image_folder gives the same folder unpacked: float32
    [C, image_size, image_size] in [0, 1], classes sorted by name, images sorted within."""
    path = Path(path)
    limits = limits or ArchiveLimits()
    members = _list_members(path, limits)
    files = _class_files(path, members, IMAGE_SUFFIXES)
    classes = sorted(files)
    count = sum(len(v) for v in files.values())
    decoded = count * 3 * image_size * image_size * 4
    if decoded > limits.max_decoded_bytes:
        raise ArchiveTooLarge(
            f"{path.name}: {count} images of {image_size}x{image_size} pixels take "
            f"{decoded} bytes decoded; the limit is {limits.max_decoded_bytes} bytes"
        )
    wanted = {m.name: (label, m) for label, c in enumerate(classes) for m in files[c]}
    arrays: dict[str, np.ndarray] = {}
    for name, data in _read_members(path, wanted):
        arrays[name] = _decode(path, name, data, image_size, limits.max_pixels)
    ordered = [m.name for c in classes for m in files[c]]
    x = stack_images([arrays[name] for name in ordered])
    y = np.asarray([wanted[name][0] for name in ordered], dtype=np.int64)
    return classification_dataset(path.name, x, y, len(classes), test_fraction, seed)


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


# -- reading ---------------------------------------------------------------------------------


def _read_members(path: Path, wanted: dict[str, object]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each wanted member, read into memory, never onto disk."""
    if archive_suffix(path.name) == ".zip":
        with zipfile.ZipFile(path) as zf:
            for name in wanted:
                try:
                    yield name, zf.read(name)  # stops at the declared size; CRC checked
                except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
                    raise DatasetError(f"{path.name}: member {name!r} is corrupt: {exc}") from None
        return
    try:
        with tarfile.open(path, "r:*") as tf:
            for info in tf:
                if info.name in wanted and info.isfile():
                    fh = tf.extractfile(info)
                    if fh is not None:
                        yield info.name, fh.read(info.size)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(f"{path.name}: not a readable tar archive: {exc}") from None


def _decode(path: Path, name: str, data: bytes, size: int, max_pixels: int) -> np.ndarray:
    try:
        # only the decoders of the suffixes taken: never EPS (Ghostscript) or other plugins
        with Image.open(io.BytesIO(data), formats=_FORMATS) as img:
            width, height = img.size  # from the header: nothing decoded yet
            if width * height > max_pixels:
                raise ArchiveTooLarge(
                    f"{path.name}: member {name!r} is {width}x{height} pixels; the limit is "
                    f"{max_pixels} pixels per image"
                )
            img.load()
            return to_array(img, size)
    except ArchiveTooLarge:
        raise
    except Image.DecompressionBombError as exc:
        raise ArchiveTooLarge(f"{path.name}: member {name!r}: {exc}") from None
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise DatasetError(f"{path.name}: member {name!r} is not a readable image: {exc}") from None
