"""Fetch a runtime pack through The Update Framework, from the app's own update repository.

Packs are TUF targets of the repository the app updates itself from (desktop/updater.py,
installers/update_repo.py), under `runtime/`, listed by a delegated targets role `runtime`
signed with the repository's targets key:

    runtime/<plan>.json                 the manifest of the plan's current pack
    runtime/<plan>-<sha256>.tar.gz      the pack itself (its content address)

This machine trusts the same root metadata as the app updater (the same metadata folder,
`<cache>/update/metadata/`), so signatures, lengths and hashes, rollback (version numbers
never go down) and freeze (expired timestamps) are checked by python-tuf, as for the app.
Any refusal raises FetchError naming the TUF error, and the store is left as it was: the
runtime in use stays in use.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desktop import shared_file
from desktop.runtime.pack import Manifest, PackError
from desktop.runtime.plan import PLANS, Choice, Machine, choose
from desktop.runtime.store import Installed, Store
from desktop.runtime.target import runs_here

if TYPE_CHECKING:
    from tuf.ngclient import Updater

PREFIX = "runtime"  # the targets' folder and the delegated role's name
PROGRESS_FILE = "fetch.json"  # in <data>/runtimes/: the download in progress, for the local API
NEEDS_TUF = "runtime packs need the 'update' extra: pip install 'gpuflex[update]'"
Progress = Callable[[int, int], None]  # (bytes so far, bytes in all)


class FetchError(Exception):
    """The pack was not fetched or not installed; the runtime in use is unchanged."""


@dataclass(frozen=True)
class Source:
    url: str  # the update repository: {url}/metadata/ and {url}/targets/
    cache_dir: Path  # <cache>/update: the trusted metadata shared with the app updater
    root: Path | None = None  # the root metadata to trust the first time (the bundle's)

    @property
    def metadata_dir(self) -> Path:
        return self.cache_dir / "metadata"

    @property
    def downloads_dir(self) -> Path:
        return self.cache_dir / "runtime"


def _updater(source: Source, fetcher: Any = None) -> Updater:
    try:
        from tuf.ngclient import Updater
    except ImportError as exc:
        raise FetchError(NEEDS_TUF) from exc
    source.metadata_dir.mkdir(parents=True, exist_ok=True)
    trusted = source.metadata_dir / "root.json"
    if not trusted.exists():
        if source.root is None or not source.root.is_file():
            raise FetchError(
                "no trusted root metadata: pass --root (the root.json the publisher ships), or "
                "run from a bundle that carries update/root.json"
            )
        shutil.copyfile(source.root, trusted)
    return Updater(
        metadata_dir=str(source.metadata_dir),
        metadata_base_url=f"{source.url}/metadata/",
        target_base_url=f"{source.url}/targets/",
        fetcher=fetcher,
    )


def _tuf_errors() -> tuple[type[Exception], ...]:
    from tuf.api.exceptions import DownloadError, RepositoryError

    return (DownloadError, RepositoryError)


def _refreshed(source: Source, fetcher: Any = None) -> Updater:
    up = _updater(source, fetcher)
    try:
        up.refresh()
    except _tuf_errors() as exc:
        raise FetchError(f"runtime metadata refused: {type(exc).__name__}: {exc}") from exc
    return up


def published(up: Updater, source: Source) -> dict[str, Manifest]:
    """The manifests the repository signs for each plan class (absent plans left out)."""
    found: dict[str, Manifest] = {}
    source.downloads_dir.mkdir(parents=True, exist_ok=True)
    for plan in PLANS:
        try:
            info = up.get_targetinfo(f"{PREFIX}/{plan}.json")
            if info is None:
                continue
            path = up.download_target(info, str(source.downloads_dir / f".{plan}.json"))
        except _tuf_errors() as exc:
            raise FetchError(f"{plan} manifest refused: {type(exc).__name__}: {exc}") from exc
        try:
            found[plan] = Manifest.from_dict(json.loads(Path(path).read_text()))
        except (ValueError, PackError) as exc:
            raise FetchError(f"the signed {plan} manifest is unusable: {exc}") from None
    return found


def check(source: Source, machine: Machine) -> tuple[Choice, dict[str, Manifest]]:
    """The plan this machine should run, and what the repository publishes."""
    up = _refreshed(source)
    manifests = published(up, source)
    return choose(machine, {k: m.to_dict() for k, m in manifests.items()}), manifests


def fetch(
    source: Source,
    store: Store,
    plan: str | None = None,
    machine: Machine | None = None,
    progress: Progress | None = None,
) -> tuple[Installed, Choice]:
    """Download, verify and install the pack for `plan` (default: the plan this machine's
    hardware calls for, desktop/runtime/plan.py), and make it current. Nothing changes in the
    store unless the whole pack verified and unpacked."""
    fetcher = _progress_fetcher(store, progress)
    up = _refreshed(source, fetcher)
    manifests = published(up, source)
    if plan is None:
        choice = choose(machine or Machine.here(), {k: m.to_dict() for k, m in manifests.items()})
    else:
        choice = Choice(plan, f"{plan}, as asked")
    manifest = manifests.get(choice.plan)
    if manifest is None:
        have = ", ".join(sorted(manifests)) or "none"
        raise FetchError(
            f"no {choice.plan} runtime pack is published at {source.url} (published: {have})"
        )
    if why := runs_here(manifest.platform, manifest.python, manifest.min_os):
        raise FetchError(f"the {choice.plan} pack is {why}")
    current = store.current()
    if current is not None and current.manifest.sha256 == manifest.sha256:
        return current, choice
    target = f"{PREFIX}/{manifest.archive}"
    try:
        info = up.get_targetinfo(target)
    except _tuf_errors() as exc:
        raise FetchError(f"{target} refused: {type(exc).__name__}: {exc}") from exc
    if info is None or info.hashes.get("sha256") != manifest.sha256:
        raise FetchError(f"{target} is not signed as the {choice.plan} manifest names it")
    archive = source.downloads_dir / manifest.archive
    if up.find_cached_target(info, str(archive)) is None:
        # into a name of its own, renamed when whole and verified: an interrupted download is
        # never mistaken for a pack (and is simply downloaded again)
        part = archive.with_name(f".{archive.name}.{os.getpid()}.part")
        fetcher.expect(info.length)
        try:
            up.download_target(info, str(part))
            os.replace(part, archive)
        except _tuf_errors() as exc:
            raise FetchError(f"{target} refused: {type(exc).__name__}: {exc}") from exc
        finally:
            part.unlink(missing_ok=True)
            fetcher.done()
    try:
        installed = store.install(archive, manifest)
    except PackError as exc:
        raise FetchError(str(exc)) from None
    archive.unlink(missing_ok=True)
    return installed, choice


def progress_state(store: Store) -> dict[str, Any] | None:
    """The download in progress, as the local API shows it; None when there is none."""
    try:
        data = json.loads((store.root / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("active") else None


def _progress_fetcher(store: Store, progress: Progress | None) -> Any:
    """python-tuf's requests fetcher, counting the bytes of a pack download: for the CLI's
    progress bar (`progress`) and for the agent's status (PROGRESS_FILE, at most every 1%)."""
    try:
        from tuf.ngclient import RequestsFetcher
    except ImportError as exc:
        raise FetchError(NEEDS_TUF) from exc

    class Fetcher(RequestsFetcher):
        def __init__(self) -> None:
            super().__init__()
            self.total = 0
            self.got = 0
            self.shown = -1

        def expect(self, total: int) -> None:
            self.total, self.got, self.shown = total, 0, -1
            self._write(active=True)

        def done(self) -> None:
            if self.total:
                self._write(active=False)
            self.total = 0

        def _write(self, active: bool) -> None:
            state = {"active": active, "bytes": self.got, "total": self.total, "at": time.time()}
            store.root.mkdir(parents=True, exist_ok=True)
            shared_file.write_atomic(store.root / PROGRESS_FILE, json.dumps(state), 0o644)

        def _chunks(self, response: Any) -> Iterator[bytes]:
            for chunk in super()._chunks(response):
                if self.total:  # a pack, not metadata
                    self.got += len(chunk)
                    if progress is not None:
                        progress(self.got, self.total)
                    pct = 100 * self.got // self.total
                    if pct != self.shown:
                        self.shown = pct
                        self._write(active=True)
                yield chunk

    return Fetcher()
