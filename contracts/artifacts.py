"""The compiled contracts committed under contracts/build/ (written by contracts/compile.js)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_DIR / "build"
SRC_DIR = PACKAGE_DIR / "src"

ESCROW = "GPUFlexEscrow"
NODE_REGISTRY = "NodeRegistry"
PROVENANCE = "ProvenanceRegistry"


@dataclass(frozen=True)
class Artifact:
    name: str
    source_name: str
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str
    test_only: bool
    sources: dict[str, str]  # source unit name -> sha256 of its text, as compiled
    sources_sha256: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Artifact:
        return cls(
            name=data["contractName"],
            source_name=data["sourceName"],
            abi=data["abi"],
            bytecode=data["bytecode"],
            deployed_bytecode=data["deployedBytecode"],
            test_only=data["testOnly"],
            sources=data["sources"],
            sources_sha256=data["sourcesSha256"],
        )


@cache
def load_artifact(name: str, build_dir: Path = BUILD_DIR) -> Artifact:
    path = build_dir / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no compiled contract {name!r} in {build_dir}")
    return Artifact.from_json(json.loads(path.read_text()))


def artifact_names(build_dir: Path = BUILD_DIR) -> list[str]:
    return sorted(p.stem for p in build_dir.glob("*.json"))


def stale_sources(build_dir: Path = BUILD_DIR) -> list[str]:
    """Our own .sol files whose text differs from what the artifacts were compiled from.

    A cheap check that needs neither node nor node_modules; the full recompile in the tests
    also covers OpenZeppelin and the compiler. Returns the offending source names (empty: ok).
    """
    recorded: dict[str, str] = {}
    for name in artifact_names(build_dir):
        recorded.update(load_artifact(name, build_dir).sources)
    ours = {
        p.relative_to(PACKAGE_DIR).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in SRC_DIR.rglob("*.sol")
    }
    stale = [unit for unit, digest in ours.items() if recorded.get(unit) != digest]
    stale += [u for u in recorded if u.startswith("src/") and u not in ours]
    return sorted(stale)
