"""Self-update of an installed bundle with tufup (The Update Framework).

The publisher keeps a TUF repository (installers/update_repo.py): signed root, targets,
snapshot and timestamp metadata under `{url}/metadata/`, one gzipped tar of the bundle per
version under `{url}/targets/`. Every bundle ships the trusted `update/root.json` it was
built with; from it the client checks each metadata signature, version and expiry before
it downloads anything, and each archive's length and SHA-256 before it unpacks it. So:

- a tampered archive or metadata file is refused (hash or signature mismatch);
- rollback: metadata older than what this machine already trusts is refused (TUF version
  numbers), and only versions newer than the installed one are ever offered;
- freeze: an expired timestamp (the server stopped signing, or an attacker replays an old
  one) is refused, so a client never silently stays on a stale view.

The installed version is a fact of the install folder: its `VERSION` file, written by the
PyInstaller spec from `desktop.__version__`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tufup.client import Client

APP_NAME = "gpuflex"  # the archive name in the repository: gpuflex-0.2.0.tar.gz
VERSION_FILE = "VERSION"
TRUSTED_ROOT = Path("update") / "root.json"  # inside the bundle
URL_FILE = Path("update") / "url.txt"  # inside the bundle: where its publisher serves updates
URL_ENV = "GPUFLEX_UPDATE_URL"
PACKAGED = Path("update") / "packaged"  # written by a system package (.deb): apt updates it


class UpdateError(Exception):
    """The update was refused or could not be done; the installed bundle is untouched."""


@dataclass(frozen=True)
class UpdateSource:
    url: str  # repository base: {url}/metadata/ and {url}/targets/
    install_dir: Path  # the bundle folder, replaced as a whole
    cache_dir: Path  # this machine's trusted metadata and downloads

    @property
    def metadata_dir(self) -> Path:
        return self.cache_dir / "metadata"

    @property
    def targets_dir(self) -> Path:
        return self.cache_dir / "targets"


def running_bundle_dir() -> Path:
    """The folder of the frozen bundle this process runs from."""
    if not getattr(sys, "frozen", False):
        raise UpdateError("not running from an installed bundle: pass --install-dir")
    return Path(sys.executable).resolve().parent


def installed_version(install_dir: Path) -> str:
    try:
        return (install_dir / VERSION_FILE).read_text().strip()
    except FileNotFoundError:
        raise UpdateError(
            f"{install_dir} is not a GPUFlex bundle: no {VERSION_FILE} file"
        ) from None


def source_for(install_dir: Path, cache_dir: Path, url: str | None = None) -> UpdateSource:
    """The update source: `url`, else $GPUFLEX_UPDATE_URL, else the bundle's update/url.txt."""
    url = url or os.environ.get(URL_ENV) or _read(install_dir / URL_FILE)
    if not url:
        raise UpdateError(f"no update URL: pass --url, set {URL_ENV} or ship {URL_FILE}")
    return UpdateSource(url=url.rstrip("/"), install_dir=install_dir, cache_dir=cache_dir)


def _read(path: Path) -> str:
    return path.read_text().strip() if path.is_file() else ""


def check(source: UpdateSource) -> str | None:
    """The newest version the repository offers above the installed one, or None."""
    client = _client(source)
    newest = client.check_for_updates(patch=False)
    return str(newest.version) if newest else None


def apply(source: UpdateSource) -> str | None:
    """Download, verify and install the newest version; returns it, or None if up to date.

    The new bundle is unpacked next to the installed one and swapped in with two renames,
    so a failure at any point leaves the installed bundle as it was. Running processes keep
    the old files they have open; the new version runs from their next start.
    """
    client = _client(source)
    newest = client.check_for_updates(patch=False)
    if newest is None:
        return None
    version = str(newest.version)
    if sys.platform == "win32":  # pragma: no cover - not run here (installers/README.md)
        # Windows cannot rename a folder whose .exe runs: tufup's robocopy script copies the
        # files over once this process exits, then starts the app again.
        from tufup.utils.platform_specific import install_update

        client.extract_dir = source.cache_dir / "staged"
        _fresh(client.extract_dir)
        install = install_update
        extra = {"purge_dst_dir": True}
    else:
        client.extract_dir = _staging_dir(source.install_dir)
        _fresh(client.extract_dir)
        install = _swap_in(version)
        extra = {}
    try:
        client.download_and_apply_update(skip_confirmation=True, install=install, **extra)
    except UpdateError:
        raise
    except Exception as exc:  # tuf's hash, length and signature errors, and I/O errors
        raise UpdateError(f"update to {version} refused: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(_staging_dir(source.install_dir), ignore_errors=True)
    if installed_version(source.install_dir) != version:
        # tufup logs and returns when a downloaded archive fails to verify
        raise UpdateError(f"update to {version} failed: the installed bundle is unchanged")
    return version


def _staging_dir(install_dir: Path) -> Path:
    # beside the install folder, on the same file system, so that the swap is two renames
    return install_dir.with_name(f".{install_dir.name}.update")


def _fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _swap_in(version: str) -> Callable[..., None]:
    def install(src_dir: Path, dst_dir: Path, **_: object) -> None:
        src_dir, dst_dir = Path(src_dir), Path(dst_dir)
        got = installed_version(src_dir)
        if got != version:  # signed, but not what the metadata named: do not install it
            raise UpdateError(f"archive for {version} holds version {got}")
        old = dst_dir.with_name(f".{dst_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        dst_dir.rename(old)
        try:
            src_dir.rename(dst_dir)
        except OSError:
            old.rename(dst_dir)  # put the installed bundle back
            raise
        shutil.rmtree(old, ignore_errors=True)

    return install


def _client(source: UpdateSource) -> Client:
    try:
        from tuf.api.exceptions import DownloadError, RepositoryError
        from tufup.client import Client  # an optional extra: imported when used
    except ImportError as exc:
        raise UpdateError("updates need the 'update' extra: pip install 'gpuflex[update]'") from exc

    if (source.install_dir / PACKAGED).exists():
        kind = (source.install_dir / PACKAGED).read_text().strip()
        raise UpdateError(f"installed by a system package ({kind}): update it with apt")
    if not os.access(source.install_dir.parent, os.W_OK):
        raise UpdateError(
            f"{source.install_dir.parent} is not writable: a system install (.deb) is "
            "updated by its package manager"
        )
    current = installed_version(source.install_dir)
    source.metadata_dir.mkdir(parents=True, exist_ok=True)
    source.targets_dir.mkdir(parents=True, exist_ok=True)
    trusted = source.metadata_dir / "root.json"
    if not trusted.exists():
        # first check on this machine: trust the root the bundle was built with; later
        # checks use the newest root reached from it (TUF root rotation)
        shipped = source.install_dir / TRUSTED_ROOT
        if not shipped.is_file():
            raise UpdateError(f"no trusted root metadata in the bundle ({TRUSTED_ROOT})")
        shutil.copyfile(shipped, trusted)

    class _Client(Client):
        def refresh(self) -> None:
            # tufup logs and swallows a failed refresh; an update check must say why it failed
            try:
                super().refresh()
            except DownloadError as exc:
                raise UpdateError(f"update server unreachable: {exc}") from exc
            except RepositoryError as exc:  # bad signature, rollback, expired (freeze)
                raise UpdateError(f"update metadata refused: {type(exc).__name__}: {exc}") from exc

    return _Client(
        app_name=APP_NAME,
        app_install_dir=source.install_dir,
        current_version=current,
        metadata_dir=source.metadata_dir,
        metadata_base_url=f"{source.url}/metadata/",
        target_dir=source.targets_dir,
        target_base_url=f"{source.url}/targets/",
    )
