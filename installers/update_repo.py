"""The publisher's update repository (tufup, The Update Framework): keys, bundles, metadata.

    python installers/update_repo.py --dir PUB init
    python installers/update_repo.py --dir PUB add dist/gpuflex      # version from its VERSION
    python installers/update_repo.py --dir PUB publish               # (add publishes too)
    python installers/update_repo.py --dir PUB root > root.json      # the root to ship

PUB holds `keystore/` (the private signing keys: keep the root key offline in production)
and `repository/` with `metadata/` and `targets/`: serve `repository/` as the update URL
(any static file server). The bundle carries `update/root.json` (the trusted root) and
`update/url.txt`; desktop/updater.py is the client.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tufup.repo import Repository

APP_NAME = "gpuflex"  # = desktop.updater.APP_NAME; not imported: this runs without the app
KEYS = "keystore"
REPO = "repository"


def _repository(pub: Path) -> Repository:
    from tufup.repo import Repository

    # tufup keeps its config file in the working directory: the publisher folder
    os.chdir(pub)
    if (pub / Repository.config_filename).exists():
        return Repository.from_config()  # the keys and metadata made by `init`
    repo = Repository(app_name=APP_NAME, repo_dir=pub / REPO, keys_dir=pub / KEYS)
    repo.initialize()  # the first time: creates the key pairs and signs root metadata
    return repo


def init(pub: Path) -> Path:
    pub.mkdir(parents=True, exist_ok=True)
    _repository(pub)
    return pub / REPO / "metadata" / "root.json"


def add(pub: Path, bundle: Path, version: str | None = None) -> str:
    version = version or (bundle / "VERSION").read_text().strip()
    repo = _repository(pub)
    # full archives only: a bsdiff patch of a torch bundle needs gigabytes of memory
    repo.add_bundle(new_bundle_dir=bundle, new_version=version, skip_patch=True)
    repo.publish_changes(private_key_dirs=[pub / KEYS])
    return version


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="update_repo", description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="publisher folder (keys, repository)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="create the signing keys and the root metadata")
    a = sub.add_parser("add", help="add a bundle folder as a new version, and publish")
    a.add_argument("bundle", type=Path)
    a.add_argument("--version", help="default: the bundle's VERSION file")
    sub.add_parser("publish", help="re-sign changed metadata (after expiry)")
    sub.add_parser("root", help="print the current root metadata (ship it as update/root.json)")
    args = p.parse_args(argv)
    pub = args.dir.resolve()
    if args.command == "init":
        print(init(pub))
    elif args.command == "add":
        print(f"published {APP_NAME} {add(pub, args.bundle.resolve(), args.version)}")
    elif args.command == "publish":
        repo = _repository(pub)
        for role in ("targets", "snapshot", "timestamp"):
            repo.refresh_expiration_date(role)
        repo.publish_changes(private_key_dirs=[pub / KEYS])
    else:
        sys.stdout.write((pub / REPO / "metadata" / "root.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
