"""`gpuflex-node` commands that need no marketplace."""

from __future__ import annotations

import json
import signal

import pytest

import desktop.agent
import desktop.daemon
from desktop import __version__
from desktop.cli import main
from desktop.config import Credentials, Paths, load_settings


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_login_stores_key_and_settings(isolated_dirs: Paths, capsys) -> None:
    assert main(["login", "--key", "gfx_u_cli", "--server", "http://m.test", "--price", "0.5"]) == 0
    assert Credentials(isolated_dirs).provider_key() == "gfx_u_cli"
    s = load_settings(isolated_dirs)
    assert s.server_url == "http://m.test" and s.price_per_gpu_hour == "0.5"
    assert main(["login", "--key", "not-a-key"]) == 2


def test_login_with_an_operator_token_makes_a_platform_node(isolated_dirs: Paths) -> None:
    """#20: a platform node registers with an operator's enrollment token, which the
    agent sends with `kind: platform` (docs/agent-api.md, Registration)."""
    assert main(["login", "--key", "gfx_u_cli", "--platform-token", "gfx_e_op"]) == 0
    s = load_settings(isolated_dirs)
    assert s.kind == "platform" and s.enrollment_token == "gfx_e_op"


def test_a_damaged_credentials_file_is_named_not_a_traceback(isolated_dirs: Paths,
                                                              capsys) -> None:  # fmt: skip
    creds = Credentials(isolated_dirs)
    creds.file.parent.mkdir(parents=True, exist_ok=True)
    creds.file.write_text("{damaged")
    for argv in (["status"], ["login", "--key", "gfx_u_cli"]):
        assert main(argv) == 2
        assert f"the credentials file {creds.file} is damaged" in capsys.readouterr().err
    assert creds.file.read_text() == "{damaged"  # left for the owner to repair


def test_status_without_an_agent(isolated_dirs: Paths, capsys) -> None:
    assert main(["status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["agent"]["state"] == "stopped" and data["marketplace"] is None


def test_status_with_a_registered_node(market, isolated_dirs: Paths, capsys) -> None:
    from desktop.config import Settings, save_settings

    save_settings(Settings(server_url=market.url), isolated_dirs)
    Credentials(isolated_dirs).set_node_key(market.url, market.register_node())
    market.earnings = {"today": "0.10", "total": "1.00"}
    assert main(["status"]) == 0
    assert "today 0.10 credits, total 1.00 credits" in capsys.readouterr().out


def test_status_says_which_gpu_waits_and_why(monkeypatch, capsys) -> None:
    """A multi-GPU machine (desktop.lanes): a line per GPU, its node, and why one waits."""
    import desktop.cli
    from desktop.agent import AgentStatus, LaneStatus, State, TaskStatus

    task = TaskStatus("t-1", "job-1", 1, "training", 0.25, 0.0)
    st = AgentStatus(state=State.WORKING, task=task,
                     reason="GPU 1 waiting: another program uses the GPU (game.exe)", lanes=(
        LaneStatus(0, "RTX 4090", State.WORKING, task=task, node_id="node-1"),
        LaneStatus(1, "RTX 3080", State.WAITING, "another program uses the GPU (game.exe)",
                   node_id="node-2"),
    ))  # fmt: skip
    monkeypatch.setattr(desktop.cli, "_local_status", lambda: {**st.to_dict(), "pid": 7})
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "agent     working: GPU 1 waiting: another program uses the GPU (game.exe)" in out
    assert "gpu 0     working, task t-1 training 25% (node node-1)" in out
    assert "gpu 1     waiting: another program uses the GPU (game.exe) (node node-2)" in out


def test_run_rejects_an_unknown_network_profile(capsys) -> None:
    assert main(["run", "--network-profile", "moon"]) == 2
    assert "unknown network profile" in capsys.readouterr().err


def test_run_rejects_a_compute_scale_below_one(capsys) -> None:
    assert main(["run", "--compute-scale", "0.5"]) == 2
    assert "at least 1" in capsys.readouterr().err


def _spy_on_run(monkeypatch) -> list:
    """The agent settings `run` would start with, for each run, without starting one."""
    seen = []

    class Spy:
        def __init__(self, settings, *args, **kw) -> None:
            seen.append(settings.extra.get("byzantine"))

    class NoDaemon:  # builds the agent as `run` would, then returns at once
        @classmethod
        def open(cls, paths, make_agent):
            make_agent()
            return cls()

        def run_forever(self) -> None:
            pass

    monkeypatch.setattr(desktop.agent, "Agent", Spy)
    monkeypatch.setattr(desktop.daemon, "Daemon", NoDaemon)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    return seen


def test_run_offers_contributors_no_fault_injection(monkeypatch, capsys) -> None:
    """`gpuflex-node run --help` offers no attack to every contributor (issue 36): the switch
    lives in desktop/fault_injection.py, for tests and the bench only."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "byzantine" not in capsys.readouterr().out.lower()
    with pytest.raises(SystemExit):
        main(["run", "--byzantine", "sign_flip"])
    assert "unrecognized arguments: --byzantine" in capsys.readouterr().err


def test_fault_injection_entry_point_reaches_the_agent_settings(monkeypatch, capsys) -> None:
    from desktop import fault_injection

    seen = _spy_on_run(monkeypatch)
    assert fault_injection.main(["--byzantine", "sign_flip"]) == 0
    assert fault_injection.main(["--byzantine", "noise", "--byzantine-scale", "5"]) == 0
    assert main(["run"]) == 0
    assert seen == ["sign_flip:10.0", "noise:5.0", None]
    assert fault_injection.main(["--byzantine", "noise", "--byzantine-scale", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fault_injection.main(["--byzantine", "poison"])
    with pytest.raises(SystemExit):  # an attack must be named
        fault_injection.main(["--byzantine-scale", "5"])
