"""Installer files are well formed; a built bundle (if `make package` ran) starts."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLERS = ROOT / "installers"


def _ini(path: Path) -> configparser.ConfigParser:
    # not strict: systemd allows repeated keys (Environment=)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_desktop_entry() -> None:
    entry = _ini(INSTALLERS / "linux" / "gpuflex-tray.desktop")["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Exec"] == "gpuflex-tray"
    assert entry["Terminal"] == "false"


def test_systemd_user_unit() -> None:
    unit = _ini(INSTALLERS / "linux" / "gpuflex-node.service")
    assert unit["Service"]["ExecStart"].endswith("gpuflex-node run")
    assert unit["Service"]["KillSignal"] == "SIGTERM"  # the agent's graceful stop
    assert unit["Install"]["WantedBy"] == "default.target"  # a user unit


def test_pyinstaller_spec_parses_and_names_both_programs() -> None:
    source = (INSTALLERS / "gpuflex.spec").read_text()
    ast.parse(source)
    assert 'name="gpuflex-node"' in source and 'name="gpuflex-tray"' in source
    for script in ("entry_node.py", "entry_tray.py"):
        ast.parse((INSTALLERS / script).read_text())


BUNDLE = ROOT / "dist" / "gpuflex" / "gpuflex-node"


@pytest.mark.skipif(not BUNDLE.exists(), reason="no bundle built (make package)")
def test_built_bundle_starts() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([str(BUNDLE), "--version"], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("gpuflex-node ")
    tray = subprocess.run([str(BUNDLE.with_name("gpuflex-tray")), "--version"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert tray.returncode == 0 and "gpuflex-tray" in tray.stdout


def test_inno_setup_script_installs_per_user_and_cleans_up() -> None:
    # Inno Setup itself runs only on Windows (.github/workflows/installers.yml)
    iss = (INSTALLERS / "windows" / "gpuflex.iss").read_text()
    for section in ("[Setup]", "[Files]", "[Icons]", "[Registry]", "[UninstallRun]"):
        assert section in iss
    assert "PrivilegesRequired=lowest" in iss  # so that the signed self-update needs no admin
    assert '#define BundleDir "..\\..\\dist\\gpuflex"' in iss
    assert "uninsdeletevalue" in iss  # the start-at-login value goes with the app


def test_macos_dmg_script_is_valid_shell() -> None:
    script = INSTALLERS / "macos" / "build_dmg.sh"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "hdiutil create" in text and "GPUFlex.app" in text


def test_ci_workflow_builds_on_each_platform() -> None:
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "installers.yml").read_text())
    runners = {job["runs-on"] for job in workflow["jobs"].values()}
    assert {"ubuntu-latest", "windows-latest", "macos-latest"} <= runners
    steps = str(workflow["jobs"])
    assert "gpuflex.iss" in steps and "build_dmg.sh" in steps and "make package" in steps


@pytest.mark.skipif(not BUNDLE.exists(), reason="no bundle built (make package)")
def test_built_bundle_carries_the_updater(tmp_path: Path) -> None:
    # the frozen app imports tufup and reads its own install folder: without a trusted root
    # (GPUFLEX_UPDATE_ROOT unset at build) it refuses before any network access; with one,
    # it fails to reach the closed port
    assert (BUNDLE.parent / "VERSION").read_text().strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["GPUFLEX_NODE_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([str(BUNDLE), "update", "--url", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 1
    shipped = (BUNDLE.parent / "update" / "root.json").exists()
    reason = "update server unreachable" if shipped else "no trusted root metadata in the bundle"
    assert reason in out.stderr, out.stderr


# the task runtime, which a runtime pack brings (#32): never in the lean bundle
RUNTIME_PACKAGES = ("torch", "numpy", "scipy", "sklearn", "transformers", "safetensors")


def runtime_files(paths: list[str]) -> list[str]:
    """The paths (relative, with /) that belong to a task runtime's packages or libraries."""
    return [
        p for p in paths
        if any(f"/{name}/" in f"/{p}" for name in RUNTIME_PACKAGES) or "libtorch" in p
    ]  # fmt: skip


def test_runtime_files_finds_torch_wherever_it_lies() -> None:
    found = runtime_files(["_internal/torch/__init__.py", "opt/gpuflex/_internal/numpy/x.so",
                           "_internal/libtorch_cpu.so", "_internal/desktop/agent.pyc",
                           "_internal/torchvision_like.txt"])  # fmt: skip
    assert found == ["_internal/torch/__init__.py", "opt/gpuflex/_internal/numpy/x.so",
                     "_internal/libtorch_cpu.so"]  # fmt: skip


@pytest.mark.skipif(not BUNDLE.exists(), reason="no bundle built (make package)")
def test_built_bundle_holds_no_task_runtime() -> None:
    # lean (#32): the agent, the tray and Qt, no torch or numpy; tasks run from a runtime pack
    folder = BUNDLE.parent
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    assert any(f.endswith(("libQt6Core.so.6", "QtCore.abi3.so")) for f in files)
    assert runtime_files(files) == []
