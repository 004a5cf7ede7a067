"""The unpacked runtime packs in the agent's data folder, and which one is in use.

    <data>/runtimes/
      cuda12-3f2a…/          one unpacked pack, read-only (files 0444/0555, folders 0555)
        site-packages/       what a task imports
        runtime.json         the manifest the archive carried
        pack.json            the full manifest (with the archive's sha256)
        files.sha256         each file's hash at unpack time, for `gpuflex-node runtime verify`
      current.json           {"current": "cuda12-3f2a…", "previous": "cuda12-0b1c…"}

A pack is unpacked into a temporary folder beside the others and renamed into place whole,
then `current.json` is switched (desktop/shared_file.py: lock, own temp file, fsync, rename).
A download or unpack that fails at any step leaves the previous runtime current and its files
untouched; the previous one is kept after a switch, so that a bad new pack can be removed and
the last good one is still there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from desktop import shared_file
from desktop.runtime.pack import SELF, SITE, Manifest, PackError, sha256_file
from desktop.runtime.target import runs_here

CURRENT = "current.json"
FULL = "pack.json"
HASHES = "files.sha256"


@dataclass(frozen=True)
class Installed:
    path: Path
    manifest: Manifest
    current: bool = False

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def site_packages(self) -> Path:
        return self.path / SITE


class Store:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "runtimes"

    # ------------------------------------------------------------------ reading

    def _pointer(self) -> dict[str, str]:
        try:
            data = json.loads((self.root / CURRENT).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise PackError(f"{self.root / CURRENT} is damaged ({exc}): remove it") from None
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)}

    def _load(self, name: str, current: bool = False) -> Installed | None:
        folder = self.root / name
        try:
            manifest = Manifest.from_dict(json.loads((folder / FULL).read_text()))
        except (OSError, ValueError, PackError):
            return None  # not a whole pack (a leftover or a damaged one): never used
        return Installed(folder, manifest, current)

    def current(self) -> Installed | None:
        """The pack in use: the current one, else the previous one if the current is gone."""
        pointer = self._pointer()
        for key in ("current", "previous"):
            if pointer.get(key) and (found := self._load(pointer[key], current=True)):
                return found
        return None

    def installed(self) -> list[Installed]:
        if not self.root.is_dir():
            return []
        now = self.current()
        folders = [p for p in sorted(self.root.iterdir()) if p.is_dir()]
        packs = [self._load(p.name, now is not None and p.name == now.name)
                 for p in folders if not p.name.startswith(".")]  # fmt: skip
        return [p for p in packs if p is not None]

    def find(self, name: str) -> Installed:
        """By folder name, plan class (its newest) or a hash prefix."""
        packs = self.installed()
        hits = [p for p in packs if p.name == name] or [
            p for p in packs if p.manifest.plan == name or p.manifest.sha256.startswith(name)
        ]
        if not hits:
            raise PackError(f"no runtime pack {name!r} is installed (gpuflex-node runtime list)")
        current = [p for p in hits if p.current]
        return current[0] if current else hits[-1]

    # ------------------------------------------------------------------ writing

    def install(self, archive: Path, manifest: Manifest) -> Installed:
        """Unpack `archive` (already verified against signed metadata) and make it current."""
        # a pack for another machine (an mps pack on Linux) is never unpacked, let alone used
        if why := runs_here(manifest.platform, manifest.python, manifest.min_os):
            raise PackError(f"the {manifest.plan} runtime pack {manifest.archive} is {why}")
        if not manifest.sha256 or sha256_file(archive) != manifest.sha256:
            raise PackError(f"{archive.name} does not match its manifest's sha256")
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / manifest.name
        if not (final / FULL).is_file():
            tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=self.root))
            try:
                self._unpack(archive, manifest, tmp)
                _read_only(tmp)
                if (final / FULL).is_file():  # another process unpacked it meanwhile
                    _remove_tree(tmp)
                else:
                    if final.exists():  # a damaged leftover of this very pack
                        _remove_tree(final)
                    os.rename(tmp, final)
            except BaseException:
                _remove_tree(tmp)
                raise
        with shared_file.locked(self.root / CURRENT):
            pointer = self._pointer()
            if pointer.get("current") != manifest.name:
                pointer = {"current": manifest.name, "previous": pointer.get("current", "")}
                shared_file.write_atomic(self.root / CURRENT, json.dumps(pointer) + "\n", 0o644)
        self._prune()
        return Installed(final, manifest, current=True)

    def _unpack(self, archive: Path, manifest: Manifest, into: Path) -> None:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar.getmembers():
                    top = member.name.split("/", 1)[0]
                    if top not in (SITE, SELF):
                        raise PackError(f"{archive.name}: unexpected member {member.name!r}")
                # "data": no absolute paths, no `..`, no links out, no devices, no setuid
                tar.extractall(into, filter="data")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise PackError(f"{archive.name} could not be unpacked: {exc}") from None
        try:
            inner = json.loads((into / SELF).read_text())
        except (OSError, ValueError):
            raise PackError(f"{archive.name} carries no {SELF}") from None
        for key in ("plan", "torch", "cuda", "rocm", "python", "platform", "min_os"):
            # min_os is newer than format 1's first packs: absent there means unknown, ""
            if inner.get(key, "" if key == "min_os" else None) != getattr(manifest, key):
                raise PackError(
                    f"{archive.name}: its {SELF} says {key}={inner.get(key)!r}, the signed "
                    f"manifest {getattr(manifest, key)!r}"
                )
        (into / FULL).write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
        lines = [f"{sha256_file(p)}  {p.relative_to(into)}\n" for p in _files(into / SITE)]
        (into / HASHES).write_text("".join(lines))

    def remove(self, name: str) -> Installed:
        pack = self.find(name)
        with shared_file.locked(self.root / CURRENT):
            pointer = self._pointer()
            if pointer.get("current") == pack.name:
                pointer = {"current": pointer.get("previous", ""), "previous": ""}
            elif pointer.get("previous") == pack.name:
                pointer["previous"] = ""
            shared_file.write_atomic(self.root / CURRENT, json.dumps(pointer) + "\n", 0o644)
        _remove_tree(pack.path)
        return pack

    def _prune(self) -> None:
        """Keep the current and the previous pack; drop older ones and unpack leftovers."""
        keep = set(self._pointer().values())
        for p in self.root.iterdir():
            # a "." folder may be another process's unpack in progress: left alone
            if p.is_dir() and not p.name.startswith(".") and p.name not in keep:
                _remove_tree(p)

    def verify(self, name: str) -> list[str]:
        """What differs from unpack time: changed, missing or added files, writable ones."""
        pack = self.find(name)
        problems: list[str] = []
        recorded: dict[str, str] = {}
        for line in (pack.path / HASHES).read_text().splitlines():
            digest, _, rel = line.partition("  ")
            recorded[rel] = digest
        seen = set()
        for p in _files(pack.site_packages):
            rel = str(p.relative_to(pack.path))
            seen.add(rel)
            if rel not in recorded:
                problems.append(f"added: {rel}")
            elif sha256_file(p) != recorded[rel]:
                problems.append(f"changed: {rel}")
            if p.stat().st_mode & 0o222:
                problems.append(f"writable: {rel}")
        problems += [f"missing: {rel}" for rel in sorted(set(recorded) - seen)]
        return problems


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _read_only(folder: Path) -> None:
    """Nothing of a pack is writable, not even by the agent's user (a task may run as it)."""
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                mode = os.lstat(p).st_mode
                os.chmod(p, 0o555 if mode & stat.S_IXUSR else 0o444)
        os.chmod(dirpath, 0o555)


def _remove_tree(folder: Path) -> None:
    if not folder.exists():
        return
    for dirpath, _, _ in os.walk(folder):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o755)
    shutil.rmtree(folder, ignore_errors=True)
