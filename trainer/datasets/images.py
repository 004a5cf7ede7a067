"""A folder of images sorted into one subfolder per class: root/<class_name>/*.png, or the
same packed in a zip or tar archive (trainer/datasets/archives.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from trainer.datasets.archives import archive_suffix, load_image_archive
from trainer.datasets.base import Dataset, DatasetError
from trainer.datasets.classification import classification_dataset
from trainer.datasets.pixels import IMAGE_SUFFIXES, stack_images, to_array


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
