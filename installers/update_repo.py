"""The publisher's update repository (tufup, The Update Framework): keys, bundles, metadata.

    python installers/update_repo.py --dir PUB init
    python installers/update_repo.py --dir PUB add dist/gpuflex      # version from its VERSION
    python installers/update_repo.py --dir PUB publish               # (add publishes too)
    python installers/update_repo.py --dir PUB root > root.json      # the root to ship
    python installers/update_repo.py --dir PUB add-runtime dist/runtime/cpu-<sha>.tar.gz

PUB holds `keystore/` (the private signing keys: keep the root key offline in production)
and `repository/` with `metadata/` and `targets/`: serve `repository/` as the update URL
(any static file server). The bundle carries `update/root.json` (the trusted root) and
`update/url.txt`; desktop/updater.py is the client.

Runtime packs (docs/runtime-packs.md) are targets of the same repository, under `runtime/`,
listed by a delegated targets role `runtime` that the same targets key signs (tufup itself
sees only the top-level targets, the app's archives); desktop/runtime/fetch.py is the client.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuf.api.metadata import Metadata
    from tufup.repo import Repository

APP_NAME = "gpuflex"  # = desktop.updater.APP_NAME; not imported: this runs without the app
KEYS = "keystore"
REPO = "repository"
RUNTIME = "runtime"  # = desktop.runtime.fetch.PREFIX: the delegated role and targets folder


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


def _runtime_role(pub: Path, repo: Repository) -> tuple[Metadata, Path]:
    """The delegated `runtime` targets role, created (and delegated to by the top-level
    targets role, with the targets role's own key) the first time."""
    from tuf.api.metadata import DelegatedRole, Delegations, Metadata, Targets

    root = repo.roles.root.signed
    key_id = root.roles["targets"].keyids[0]
    targets = repo.roles.targets.signed
    if targets.delegations is None or RUNTIME not in (targets.delegations.roles or {}):
        role = DelegatedRole(name=RUNTIME, keyids=[key_id], threshold=1, terminating=True,
                             paths=[f"{RUNTIME}/*"])  # fmt: skip
        targets.delegations = Delegations(keys={key_id: root.keys[key_id]}, roles={RUNTIME: role})
    path = pub / REPO / "metadata" / f"{RUNTIME}.json"
    if path.exists():
        return Metadata.from_file(str(path)), path
    return Metadata(Targets(version=1, expires=_in_days(7), targets={})), path


def _in_days(days: float) -> datetime:
    from tufup.repo import in_

    return in_(days)


def _publish_runtime(pub: Path, repo: Repository, meta: Metadata, path: Path) -> None:
    """Sign the runtime role with the targets key, then the top-level roles (tufup) with the
    snapshot naming the runtime role's new version."""
    from securesystemslib.interface import import_ed25519_privatekey_from_file
    from securesystemslib.signer import SSlibSigner
    from tuf.api.metadata import MetaFile
    from tuf.api.serialization.json import JSONSerializer

    if path.exists():  # a new role starts at version 1
        meta.signed.version += 1
    meta.signed.expires = _in_days(repo.expiration_days.get("targets", 7))
    key_name = repo.key_map["targets"][0]
    key_file = repo.keys.find_private_key(key_name=key_name, key_dirs=[pub / KEYS])
    if key_file is None:
        raise SystemExit(f"update_repo: the targets key ({key_name}) is not in {pub / KEYS}")
    meta.signatures.clear()
    meta.sign(SSlibSigner(import_ed25519_privatekey_from_file(str(key_file), prompt=False)))
    meta.to_file(str(path), serializer=JSONSerializer(compact=False))
    repo.roles.snapshot.signed.meta[f"{RUNTIME}.json"] = MetaFile(version=meta.signed.version)
    repo.publish_changes(private_key_dirs=[pub / KEYS])


def add_runtime(pub: Path, archive: Path) -> str:
    """Publish a runtime pack: the archive and its manifest (`<plan>-<sha>.json` beside it, as
    scripts/build-runtime-pack.sh writes them) become targets, and `runtime/<plan>.json`
    names the new pack as that plan's current one."""
    from tuf.api.metadata import TargetFile

    manifest_file = archive.with_name(archive.name.removesuffix(".tar.gz") + ".json")
    manifest = json.loads(manifest_file.read_text())
    plan = manifest["plan"]
    pub.mkdir(parents=True, exist_ok=True)  # a new repository: `init` done here
    repo = _repository(pub)
    meta, path = _runtime_role(pub, repo)
    folder = pub / REPO / "targets" / RUNTIME
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, folder / manifest["archive"])
    shutil.copyfile(manifest_file, folder / f"{plan}.json")
    for name in (manifest["archive"], f"{plan}.json"):
        target = f"{RUNTIME}/{name}"
        meta.signed.targets[target] = TargetFile.from_file(target, str(folder / name))
    _publish_runtime(pub, repo, meta, path)
    return f"{plan} {manifest['archive']}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="update_repo", description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="publisher folder (keys, repository)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="create the signing keys and the root metadata")
    a = sub.add_parser("add", help="add a bundle folder as a new version, and publish")
    a.add_argument("bundle", type=Path)
    a.add_argument("--version", help="default: the bundle's VERSION file")
    sub.add_parser("publish", help="re-sign changed metadata (after expiry)")
    r = sub.add_parser("add-runtime", help="publish a runtime pack (its manifest beside it)")
    r.add_argument("archive", type=Path)
    sub.add_parser("root", help="print the current root metadata (ship it as update/root.json)")
    args = p.parse_args(argv)
    pub = args.dir.resolve()
    if args.command == "init":
        print(init(pub))
    elif args.command == "add":
        print(f"published {APP_NAME} {add(pub, args.bundle.resolve(), args.version)}")
    elif args.command == "add-runtime":
        print(f"published runtime {add_runtime(pub, args.archive.resolve())}")
    elif args.command == "publish":
        repo = _repository(pub)
        for role in ("targets", "snapshot", "timestamp"):
            repo.refresh_expiration_date(role)
        if (pub / REPO / "metadata" / f"{RUNTIME}.json").exists():
            _publish_runtime(pub, repo, *_runtime_role(pub, repo))  # re-signed with the rest
        else:
            repo.publish_changes(private_key_dirs=[pub / KEYS])
    else:
        sys.stdout.write((pub / REPO / "metadata" / "root.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
