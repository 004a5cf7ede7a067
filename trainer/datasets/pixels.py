"""Decoded images as arrays, shared by image folders and image archives."""

from __future__ import annotations

import numpy as np
from PIL import Image

from trainer.datasets.archive_listing import IMAGE_SUFFIXES as IMAGE_SUFFIXES

# Modes whose pixels are a single grey level; "P" (palette) is decided by content instead.
_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_WIDE_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


def stack_images(arrays: list[np.ndarray]) -> np.ndarray:
    """[N, C, S, S] float32; C is 3 when any image is in colour."""
    if any(a.shape[0] == 3 for a in arrays):
        # Grey -> RGB by repeating the channel is exactly what Pillow's convert("RGB") does.
        arrays = [np.repeat(a, 3, axis=0) if a.shape[0] == 1 else a for a in arrays]
    return np.stack(arrays).astype(np.float32)


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
