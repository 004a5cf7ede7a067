"""The per-user service's unit texts (all platforms' texts are checked here, on Linux)."""

from __future__ import annotations

import configparser
import plistlib
from pathlib import Path

from desktop import service_units
from desktop.cli import main
from desktop.entry import node_command


def test_systemd_user_unit() -> None:
    text = service_units.systemd_unit(["/opt/gpuflex/gpuflex-node", "run"],
                                      {"GPUFLEX_NODE_DATA_DIR": "/srv/my data"})  # fmt: skip
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(text)
    assert unit["Service"]["ExecStart"] == "/opt/gpuflex/gpuflex-node run"
    assert unit["Service"]["Environment"] == "'GPUFLEX_NODE_DATA_DIR=/srv/my data'"
    assert unit["Service"]["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "default.target"  # a user unit: starts at login


def test_launch_agent_plist(tmp_path: Path) -> None:
    plist = plistlib.loads(service_units.launch_agent(["/Applications/GPUFlex.app/x", "run"],
                                                      tmp_path / "agent.log"))  # fmt: skip
    assert plist["Label"] == service_units.LABEL
    assert plist["ProgramArguments"] == ["/Applications/GPUFlex.app/x", "run"]
    assert plist["RunAtLoad"] and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"] == str(tmp_path / "agent.log")


def test_windows_run_value_quotes_spaces() -> None:
    value = service_units.windows_run_value([r"C:\Program Files\GPUFlex\gpuflex-node.exe", "run"])
    assert value == r'"C:\Program Files\GPUFlex\gpuflex-node.exe" run'


def test_install_writes_the_user_unit_without_starting_it(isolated_dirs, tmp_path) -> None:
    path = Path(service_units.install("linux"))
    assert path == tmp_path / "xdg" / "systemd" / "user" / "gpuflex-node.service"
    text = path.read_text()
    assert "desktop.cli run" in text or "gpuflex-node" in text
    assert f"GPUFLEX_NODE_DATA_DIR={isolated_dirs.data}" in text  # the same agent folder
    assert service_units.is_installed("linux")
    service_units.uninstall("linux")
    assert not path.exists()


def test_install_on_macos_writes_the_launch_agent(isolated_dirs, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = Path(service_units.install("darwin"))
    assert path.parent == tmp_path / "Library" / "LaunchAgents"
    assert plistlib.loads(path.read_bytes())["ProgramArguments"] == node_command()
    path.unlink()  # uninstall("darwin") runs launchctl: macOS only


def test_cli_service_show(capsys) -> None:
    assert main(["service", "show"]) == 0
    assert "[Service]" in capsys.readouterr().out
