"""A runtime pack: one gzipped tar of a `site-packages/` folder (torch for one platform and
what the trainer imports with it) and its manifest.

The archive's name is its content address, `<plan>-<sha256>.tar.gz`; the manifest is JSON:

    {"format": 1, "plan": "cuda12", "torch": "2.13.0", "cuda": "12.8", "rocm": "",
     "min_driver": "570.26", "python": "cp311", "platform": "linux_x86_64", "min_os": "",
     "sha256": "…", "size": 2912345678, "archive": "cuda12-….tar.gz"}

The archive also carries the manifest, less `sha256`/`size`/`archive` (which it cannot know of
itself), as `runtime.json`: an unpacked pack describes itself. Building reads torch's version
from `torch/version.py` as text, so the agent never imports the torch it packs.

`python`/`platform` are the machine the pack is FOR, by default the one building it; a pack
built for another (`mps` on Linux: `--platform macosx_arm64 --python cp311`) is checked against
what its wheels are (desktop/runtime/target.py), and `min_os` is the newest macOS version its
wheels' tags name (torch 2.13.0's macOS wheel needs 14.0).

    python -m desktop.runtime.pack build --plan cpu --site-packages DIR --out dist/runtime
    python -m desktop.runtime.pack build --plan mps --platform macosx_arm64 --python cp311 ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from desktop.runtime import target
from desktop.runtime.plan import CUDA_MIN_DRIVER, PLANS
from desktop.runtime.target import platform_tag, python_tag

__all__ = ["Manifest", "PackError", "build", "platform_tag", "python_tag", "torch_facts"]

FORMAT = 1
SITE = "site-packages"  # the folder a pack unpacks its packages into
SELF = "runtime.json"  # the manifest inside the archive and the unpacked pack
CHUNK = 1 << 20


class PackError(Exception):
    """A pack or manifest that cannot be used, with what is wrong with it."""


@dataclass(frozen=True)
class Manifest:
    plan: str
    torch: str
    cuda: str = ""
    rocm: str = ""
    min_driver: str = ""
    python: str = ""  # the interpreter's tag the packages were built for: "cp311"
    platform: str = ""  # "linux_x86_64", "macosx_arm64", "win_amd64" (target.platform_tag)
    min_os: str = ""  # the oldest OS release the wheels run on: "14.0" (macOS); "" unknown
    sha256: str = ""
    size: int = 0
    archive: str = ""
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise PackError("a runtime manifest must be a JSON object")
        if data.get("format") != FORMAT:
            raise PackError(f"runtime manifest format {data.get('format')!r} is not {FORMAT}")
        if data.get("plan") not in PLANS:
            raise PackError(f"unknown plan class {data.get('plan')!r}: one of {', '.join(PLANS)}")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise PackError(f"runtime manifest: {exc}") from None

    @property
    def name(self) -> str:
        """The unpacked pack's folder name: plan and the first 16 hex digits of its hash."""
        return f"{self.plan}-{self.sha256[:16]}"

    def describe(self) -> str:
        gpu = f", CUDA {self.cuda}" if self.cuda else f", ROCm {self.rocm}" if self.rocm else ""
        return f"{self.plan}: torch {self.torch}{gpu} ({self.python} {self.platform})"


def torch_facts(site: Path) -> dict[str, str]:
    """torch's version and its CUDA/HIP version, read from torch/version.py as text."""
    try:
        text = (site / "torch" / "version.py").read_text()
    except OSError:
        raise PackError(f"{site} holds no torch (torch/version.py is missing)") from None

    def field(name: str) -> str:
        m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
        return m.group(1) if m else ""

    return {"torch": field("__version__"), "cuda": field("cuda"), "rocm": field("hip")}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def build(site: Path, plan: str, out_dir: Path, min_driver: str | None = None,
          platform: str | None = None, python: str | None = None) -> Manifest:  # fmt: skip
    """Pack `site` (a site-packages folder) as a `plan` runtime for `platform`/`python`
    (default: this machine's) into `out_dir`: the archive `<plan>-<sha256>.tar.gz` and its
    manifest `<plan>-<sha256>.json`."""
    if plan not in PLANS:
        raise PackError(f"unknown plan class {plan!r}: one of {', '.join(PLANS)}")
    platform = target.platform_family(platform) if platform else platform_tag()
    python = python or python_tag()
    if plan == "mps" and platform != "macosx_arm64":
        raise PackError(f"an mps pack is for macosx_arm64 (Apple silicon), not {platform}")
    facts = torch_facts(site)
    if plan.startswith("cuda"):
        if not facts["cuda"]:
            raise PackError(f"the torch in {site} ({facts['torch']}) is not a CUDA build")
        if f"cuda{facts['cuda'].split('.')[0]}" != plan:
            raise PackError(
                f"the torch in {site} ({facts['torch']}) is a CUDA {facts['cuda']} build, not "
                f"{plan}: build it as cuda{facts['cuda'].split('.')[0]} (PyPI's torch 2.13.0 "
                "wheels are CUDA 13.0), or take torch from a CUDA 12 index "
                "(RUNTIME_INDEX_URL=https://download.pytorch.org/whl/cu128)"
            )
    if plan in ("cpu", "mps") and (facts["cuda"] or facts["rocm"]):
        raise PackError(f"the torch in {site} ({facts['torch']}) is a GPU build, not {plan}")
    if plan == "rocm" and not facts["rocm"]:
        raise PackError(
            f"the torch in {site} ({facts['torch']}) is not a ROCm build: PyPI has none, take "
            "torch from PyTorch's ROCm index (RUNTIME_INDEX_URL)"
        )
    try:
        found = target.check(site, platform, python)
    except ValueError as exc:
        raise PackError(str(exc)) from None
    if min_driver is None:
        cuda = ".".join(facts["cuda"].split(".")[:2])
        min_driver = CUDA_MIN_DRIVER.get(cuda, "") if cuda else ""
        if cuda and not min_driver:
            raise PackError(f"no known minimum driver for CUDA {cuda}: pass --min-driver")
    inner = Manifest(plan=plan, min_driver=min_driver, python=python, platform=platform,
                     min_os=found.min_macos if platform.startswith("macosx") else "",
                     **facts)  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=".pack-", suffix=".tar.gz")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        self_json = out_dir / f".{SELF}.{os.getpid()}"
        self_json.write_text(json.dumps(inner.to_dict(), indent=2) + "\n")
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            tar.add(self_json, arcname=SELF)
            # sorted, owner-neutral members: the same folder packs to the same bytes' content
            for path in sorted(site.rglob("*")):
                if "__pycache__" in path.parts and path.suffix != ".pyc":
                    continue
                info = tar.gettarinfo(str(path), arcname=f"{SITE}/{path.relative_to(site)}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
        self_json.unlink()
        digest = sha256_file(tmp)
        manifest = Manifest(**{**inner.to_dict(), "sha256": digest, "size": tmp.stat().st_size,
                               "archive": f"{plan}-{digest}.tar.gz"})  # fmt: skip
        os.chmod(tmp, 0o644)  # mkstemp's 0600: a pack is published, not a secret
        os.replace(tmp, out_dir / manifest.archive)
    finally:
        tmp.unlink(missing_ok=True)
    manifest_path = out_dir / f"{plan}-{digest}.json"
    manifest_path.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="desktop.runtime.pack", description="build a runtime pack")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="pack a site-packages folder")
    b.add_argument("--plan", required=True, choices=PLANS)
    b.add_argument("--site-packages", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--min-driver", help="default: from the CUDA version torch was built with")
    b.add_argument("--platform", help="the platform the pack is for, e.g. macosx_arm64 "
                   "(default: this machine's); checked against the wheels")  # fmt: skip
    b.add_argument("--python", help="the Python tag the pack is for, e.g. cp311 (default: "
                   "this interpreter's); checked against the wheels")  # fmt: skip
    args = p.parse_args(argv)
    try:
        m = build(args.site_packages, args.plan, args.out, args.min_driver, args.platform,
                  args.python)  # fmt: skip
    except PackError as exc:
        print(f"build-runtime-pack: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({**m.to_dict(), "path": str(args.out / m.archive)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
