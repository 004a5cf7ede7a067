"""Image archives for tests: small class-folder zips and tars, good and hostile."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image


def png(value: int, size: int = 8, mode: str = "L") -> bytes:
    """A tiny PNG whose pixels say which class it is (dark or bright, with some noise)."""
    rng = np.random.default_rng(value)
    pixels = np.clip(rng.normal(value, 20, size=(size, size)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, mode="L").convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def class_members(per_class: int = 12, classes: tuple[str, ...] = ("dark", "light")) -> dict:
    """{member name: bytes} for `per_class` images of each class."""
    members = {}
    for c, name in enumerate(classes):
        for i in range(per_class):
            level = 40 + 170 * c
            members[f"{name}/{i:03d}.png"] = png(level + i, mode="RGB" if i % 3 == 0 else "L")
    return members


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def write_tar(path: Path, members: dict[str, bytes], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def tar_with(path: Path, special: tarfile.TarInfo, mode: str = "w") -> Path:
    """A good tar plus one special member (a link, a device)."""
    write_tar(path, class_members(4), mode)
    with tarfile.open(path, "a") as tf:
        tf.addfile(special)
    return path


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def unpack_to_folder(root: Path, members: dict[str, bytes]) -> Path:
    for name, data in members.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root
