"""What a bundle folder is made of: bytes per component, largest first (installers/README.md).

python installers/bundle_sizes.py dist/gpuflex [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# component -> top-level names in the bundle's _internal/ folder (PyInstaller 6 layout)
COMPONENTS: dict[str, tuple[str, ...]] = {
    "torch (libs)": ("torch/lib",),
    "torch (python, rest)": ("torch", "functorch", "torchgen"),
    # Qt's libraries and the ICU they link sit at the top of _internal/ (PyInstaller 6)
    "Qt (PySide6, shiboken6, libQt6*, ICU)": (
        "PySide6",
        "shiboken6",
        "libQt6",
        "libicu",
        "libpyside6",
        "libshiboken6",
    ),
    "cryptography, OpenSSL, libsodium": ("cryptography", "libcrypto", "libssl", "nacl"),
    "Python (interpreter, stdlib)": ("libpython3", "base_library.zip", "python3", "lib-dynload"),
    "numpy, scipy, scikit-learn": (
        "numpy",
        "numpy.libs",
        "scipy",
        "scipy.libs",
        "sklearn",
        "scikit_learn.libs",
    ),
    "transformers, tokenizers, peft": ("transformers", "tokenizers", "peft", "safetensors"),
}


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def _component(rel: str) -> str:
    best, length = "other", 0
    for component, prefixes in COMPONENTS.items():
        for prefix in prefixes:  # the longest matching prefix wins: torch/lib before torch
            if rel.startswith(prefix) and len(prefix) > length:
                best, length = component, len(prefix)
    return best


def breakdown(bundle: Path) -> dict[str, int]:
    sizes = dict.fromkeys([*COMPONENTS, "other"], 0)
    internal = bundle / "_internal"
    for path in bundle.rglob("*"):
        if path.is_file() or path.is_symlink():
            rel = path.relative_to(internal).as_posix() if internal in path.parents else ""
            sizes[_component(rel) if rel else "other"] += path.lstat().st_size
    sizes["total"] = sum(sizes.values())
    return sizes


def largest(bundle: Path, n: int = 15) -> list[tuple[str, int]]:
    internal = bundle / "_internal"
    entries = internal.iterdir() if internal.is_dir() else iter(())
    items = [(str(p.relative_to(bundle)), _size(p)) for p in entries]
    return sorted(items, key=lambda x: -x[1])[:n]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sizes = breakdown(args.bundle)
    if args.json:
        print(json.dumps({"components": sizes, "largest": dict(largest(args.bundle))}, indent=2))
        return 0
    mb = 1024 * 1024
    print("| component | MiB |\n|---|---:|")
    for name, size in sorted(sizes.items(), key=lambda x: (x[0] == "total", -x[1])):
        print(f"| {name} | {size / mb:.0f} |")
    print("\nlargest entries in _internal/:")
    for name, size in largest(args.bundle):
        print(f"  {size / mb:8.1f} MiB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
