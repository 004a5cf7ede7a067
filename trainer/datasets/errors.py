"""What a dataset loader raises, and the limits an image archive is read under: pure data,
so the web process can name them without importing torch, numpy or PIL (issue 36)."""

from __future__ import annotations

from dataclasses import dataclass

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")


class DatasetError(ValueError):
    """User data that cannot be loaded; the message names the file and what is wrong."""


class ArchiveTooLarge(DatasetError):
    """An archive over a size limit (a likely decompression bomb): the marketplace's 413."""


def archive_suffix(name: str) -> str | None:
    """The archive suffix `name` ends with (lower case), or None."""
    lower = name.lower()
    return next((s for s in ARCHIVE_SUFFIXES if lower.endswith(s)), None)


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive may hold. The defaults suit a dataset that fits in a node's memory;
    the marketplace passes its own (settings.GPUFLEX["IMAGE_ARCHIVE"])."""

    max_members: int = 100_000
    max_total_bytes: int = 1 << 30  # all members decompressed
    max_ratio: float = 100.0  # a member's decompressed size over its packed size
    max_pixels: int = 4096 * 4096  # per image, from its header, before decoding
    max_decoded_bytes: int = 2 << 30  # the float32 tensor the images become
