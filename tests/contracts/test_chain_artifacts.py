"""The committed build/ must be exactly what the pinned compiler makes of src/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from contracts.artifacts import BUILD_DIR, PACKAGE_DIR, artifact_names, load_artifact, stale_sources

EXPECTED = {
    "GPUFlexEscrow",
    "NodeRegistry",
    "ProvenanceRegistry",
    "MockERC20",
    "ReentrantReceiver",
    "RejectingBuyer",
}


def test_every_contract_has_an_artifact() -> None:
    assert set(artifact_names()) == EXPECTED
    for name in EXPECTED:
        artifact = load_artifact(name)
        assert artifact.bytecode.startswith("0x") and len(artifact.bytecode) > 100
        assert artifact.test_only == artifact.source_name.startswith("src/test/")


def test_artifacts_record_the_pinned_compiler_and_settings() -> None:
    package = json.loads((PACKAGE_DIR / "package.json").read_text())
    pinned = package["dependencies"]["solc"]
    data = json.loads((BUILD_DIR / "GPUFlexEscrow.json").read_text())
    assert data["compiler"]["version"].startswith(pinned + "+")
    assert data["compiler"]["settings"]["evmVersion"] == "cancun"
    assert data["compiler"]["settings"]["optimizer"]["enabled"] is True


def test_sources_unchanged_since_compile() -> None:
    # Needs no node: catches the common case, an edited .sol without a recompile.
    assert stale_sources() == [], "run `node contracts/compile.js` and commit contracts/build/"


def test_recompiling_reproduces_the_committed_artifacts(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None or not (PACKAGE_DIR / "node_modules" / "solc").is_dir():
        pytest.skip("needs node and `npm ci --prefix contracts`")
    subprocess.run(
        [node, str(PACKAGE_DIR / "compile.js"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    fresh = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    committed = {p.name: json.loads(p.read_text()) for p in BUILD_DIR.glob("*.json")}
    assert sorted(fresh) == sorted(committed)
    for name, artifact in fresh.items():
        # Compare field by field so a failure says what went stale.
        for field in ("sourcesSha256", "abi", "bytecode", "deployedBytecode"):
            assert artifact[field] == committed[name][field], (
                f"contracts/build/{name} is stale ({field}): run `node contracts/compile.js`"
            )
