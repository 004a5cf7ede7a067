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
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from trainer.datasets.archive_listing import _class_files, _list_members
from trainer.datasets.archive_listing import check_image_archive as check_image_archive
from trainer.datasets.base import Dataset
from trainer.datasets.classification import classification_dataset
from trainer.datasets.errors import ArchiveLimits, ArchiveTooLarge, DatasetError, archive_suffix
from trainer.datasets.pixels import IMAGE_SUFFIXES, stack_images, to_array

_FORMATS = ("PNG", "JPEG", "BMP", "GIF")  # IMAGE_SUFFIXES' formats


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
