"""A folder of images sorted into one subfolder per class: root/<class_name>/*.png, or the
same packed in a zip or tar archive (trainer/datasets/archives.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from trainer.datasets.archives import archive_suffix, load_image_archive
from trainer.datasets.base import Dataset, DatasetError
from trainer.datasets.classification import classification_dataset

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif"})

# Modes whose pixels are a single grey level; "P" (palette) is decided by content instead.
_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_WIDE_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


def load_image_folder(
    root: str | Path, image_size: int = 28, test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """Images as float32 [C, image_size, image_size] in [0, 1]; class names sorted -> ids.

    C is 3 if any image is in colour, else 1, so a grey dataset is not tripled in size.
    """
    root = Path(root)
    if root.is_file() and archive_suffix(root.name):
        return load_image_archive(root, image_size, test_fraction, seed)
    classes = _class_folders(root)
    arrays: list[np.ndarray] = []
    labels: list[int] = []
    for label, folder in enumerate(classes):
        files = _image_files(folder)
        for file in files:
            arrays.append(_load_image(file, image_size))
            labels.append(label)
    x = stack_images(arrays)
    y = np.asarray(labels, dtype=np.int64)
    return classification_dataset(root.name, x, y, len(classes), test_fraction, seed)


def stack_images(arrays: list[np.ndarray]) -> np.ndarray:
    """[N, C, S, S] float32; C is 3 when any image is in colour."""
    if any(a.shape[0] == 3 for a in arrays):
        # Grey -> RGB by repeating the channel is exactly what Pillow's convert("RGB") does.
        arrays = [np.repeat(a, 3, axis=0) if a.shape[0] == 1 else a for a in arrays]
    return np.stack(arrays).astype(np.float32)


def _class_folders(root: Path) -> list[Path]:
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DatasetError(f"{root}: image folder {what}")
    # Hidden folders (.git, .ipynb_checkpoints) are tooling, not classes.
    folders = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.name,
    )
    if not folders:
        raise DatasetError(
            f"{root}: no class subfolders (expected {root}/<class_name>/<image files>)"
        )
    if len(folders) < 2:
        raise DatasetError(
            f"{root}: only one class folder ({folders[0].name!r}); classification needs at least 2"
        )
    return folders


def _image_files(folder: Path) -> list[Path]:
    files = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")
    )
    if not files:
        kinds = ", ".join(sorted(IMAGE_SUFFIXES))
        raise DatasetError(f"{folder}: class folder has no images ({kinds})")
    return files


def _load_image(path: Path, size: int) -> np.ndarray:
    """[1 or 3, size, size] float32 in [0, 1]; raises DatasetError naming a bad file."""
    try:
        with Image.open(path) as img:
            img.load()  # decode now: a truncated file only fails here
            return to_array(img, size)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{path}: unreadable or corrupt image: {exc}") from None


def to_array(img: Image.Image, size: int) -> np.ndarray:
    resample = Image.Resampling.BILINEAR
    if img.mode in _WIDE_MODES:
        # 16-bit and float images: convert("L") would clip everything above 255 to white.
        grey = np.asarray(img, dtype=np.float32)
        scale = 1.0 if img.mode == "F" else 65535.0
        small = Image.fromarray(grey / scale, mode="F").resize((size, size), resample)
        return np.clip(np.asarray(small, dtype=np.float32), 0.0, 1.0)[None]
    if img.mode in _GREY_MODES:
        small = img.convert("L").resize((size, size), resample)
        return (np.asarray(small, dtype=np.float32) / 255.0)[None]
    rgb = np.asarray(img.convert("RGB").resize((size, size), resample), dtype=np.float32)
    rgb = rgb.transpose(2, 0, 1) / 255.0
    if img.mode in ("P", "PA") and _is_grey(rgb):
        return rgb[:1]  # a palette of greys (common for GIFs) is not a colour image
    return rgb


def _is_grey(chw: np.ndarray) -> bool:
    return bool(np.array_equal(chw[0], chw[1]) and np.array_equal(chw[1], chw[2]))
