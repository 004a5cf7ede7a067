"""The agent's runtime part (desktop/runtime_keeper.py) with presence: the runtime in use is
what registration reports and what the sandbox runs; a pack fetched later is told to the
marketplace by the next heartbeat, once."""

from __future__ import annotations

import threading
from pathlib import Path

from runtime_world import repo_tool, served, tiny_pack, tiny_site

from desktop import runtime_keeper
from desktop.agent import Agent
from desktop.client import Backoff, MarketplaceClient
from desktop.presence import Presence
from desktop.runtime import pack
from desktop.runtime.store import Store
from desktop.sandbox import Limits, Sandbox

FAST = Backoff(base_s=0.01, cap_s=0.05, attempts=2)


def _agent(settings, paths, bench, hardware) -> Agent:
    node = Agent(settings, paths, bench=bench, hardware=hardware, backoff=FAST)  # never started
    node.client = MarketplaceClient(settings.server_url, None, backoff=FAST,
                                    stop=threading.Event())  # fmt: skip
    node._sandbox = Sandbox(Limits(), use_bwrap=False, warm=False)
    return node


def test_the_runtime_in_use_is_registered_and_a_new_pack_is_told_once(
    market, logged_in, isolated_dirs, fake_bench, hardware, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv("GPUFLEX_UPDATE_URL", raising=False)
    node = _agent(logged_in, isolated_dirs, fake_bench, hardware)
    # a dev install: no pack, torch in this environment; nothing is added to the task's path
    node.runtime = runtime_keeper.prepare(node)
    assert node.runtime is not None and node.runtime.source == "environment"
    assert node._sandbox.packages == [] and "PYTHONPATH" not in node._sandbox.env
    assert node.status().runtime["torch"].startswith("2.")
    presence = Presence(node)
    assert presence.register()
    assert market.registrations[0]["runtime"] == node.runtime.report()
    presence.beat()
    assert "runtime" not in market.heartbeats[-1]  # unchanged: not sent again

    # the owner fetched a pack: the agent runs tasks with it, and says so once
    m = tiny_pack(tmp_path)
    installed = Store(isolated_dirs.data).install(tmp_path / "out" / m.archive, m)
    node.runtime = runtime_keeper.prepare(node)
    assert node.runtime.source == "pack" and node._sandbox.packages == [installed.site_packages]
    assert node._sandbox.env["PYTHONPATH"].split(":")[0] == str(installed.site_packages)
    presence.beat()
    assert market.heartbeats[-1]["runtime"] == {"plan": "cpu", "torch": "2.13.0", "cuda": "",
                                                "source": "pack"}  # fmt: skip
    presence.beat()
    assert "runtime" not in market.heartbeats[-1]


def test_an_agent_without_a_runtime_fetches_the_pack_on_first_need(
    market, logged_in, isolated_dirs, fake_bench, hardware, tmp_path: Path, monkeypatch
) -> None:
    """No pack and (forced) no environment runtime: the agent fetches the plan this machine
    runs from the update repository (TUF, loopback), with its progress in the status."""
    monkeypatch.chdir(tmp_path)  # the repo tool changes directory; restored after the test
    tool = repo_tool()
    pub = tmp_path / "pub"
    root_json = tool.init(pub)
    m = pack.build(tiny_site(tmp_path / "b", importable_torch=False), "cpu", tmp_path / "out")
    tool.add_runtime(pub, tmp_path / "out" / m.archive)
    node = _agent(logged_in, isolated_dirs, fake_bench, hardware)
    seen: list[dict] = []  # the status's runtime as the local API's /status would show it
    real_set = node._set

    def spy(**changes: object) -> None:
        real_set(**changes)
        seen.append(node.status().runtime)

    monkeypatch.setattr(node, "_set", spy)
    monkeypatch.setenv("GPUFLEX_RUNTIME", "pack")  # this test suite's torch does not count
    monkeypatch.setenv("GPUFLEX_UPDATE_ROOT", str(root_json))
    with served(pub / "repository") as url:
        monkeypatch.setenv("GPUFLEX_UPDATE_URL", url)
        node.runtime = runtime_keeper.prepare(node)
    assert node.runtime is not None and node.runtime.source == "pack"
    assert node._sandbox.packages == [node.runtime.site_packages]
    assert {"fetch": {"bytes": m.size, "total": m.size}} in seen  # the local API showed it
    assert node.status().runtime == node.runtime.report()
