"""The agent's local API on a real Unix socket (and the loopback + token transport)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import time
from collections.abc import Iterator

import pytest

from desktop.agent import Agent, State
from desktop.cli import main
from desktop.client import Backoff
from desktop.config import Credentials, Paths, load_settings
from desktop.control import ControlClient, ControlError, Endpoint, NotRunning, endpoint_file
from desktop.daemon import Daemon
from desktop.service_lock import AlreadyRunning


def wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.05)


def open_daemon(paths: Paths, settings, bench, transport: str | None = None) -> Daemon:
    return Daemon.open(paths, lambda: Agent(settings, paths, bench=bench, claim_wait_s=1,
                                            idle_sleep_s=0.1,
                                            backoff=Backoff(base_s=0.05, cap_s=0.3)),
                       transport)  # fmt: skip


@pytest.fixture
def daemon(market, logged_in, isolated_dirs, fake_bench) -> Iterator[Daemon]:
    d = open_daemon(isolated_dirs, logged_in, fake_bench).start()
    yield d
    d.close()


def raw(paths: Paths, method: str, path: str, body: bytes = b"", headers=None):
    ep = Endpoint.read(paths)
    conn = ep.connection(10)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def test_the_socket_and_its_folder_are_the_users_alone(daemon, isolated_dirs) -> None:
    ep = Endpoint.read(isolated_dirs)
    assert ep.transport == "unix" and ep.pid == os.getpid() and not ep.token
    assert stat.S_ISSOCK(os.stat(ep.path).st_mode)
    assert stat.S_IMODE(os.stat(ep.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(ep.path)).st_mode) == 0o700
    assert stat.S_IMODE(endpoint_file(isolated_dirs).stat().st_mode) == 0o600


def test_a_second_daemon_on_the_same_folder_is_refused(daemon, logged_in, isolated_dirs,
                                                       fake_bench) -> None:  # fmt: skip
    with pytest.raises(AlreadyRunning) as refused:
        open_daemon(isolated_dirs, logged_in, fake_bench)
    assert refused.value.pid == os.getpid()
    assert ControlClient(isolated_dirs).running()  # the first one is untouched


def test_status_pause_resume(daemon, isolated_dirs) -> None:
    client = ControlClient(isolated_dirs)
    wait_for(lambda: client.status()["state"] == "idle")
    st = client.status()
    assert st["pid"] == os.getpid() and st["login"]["provider_key"] is True
    assert st["earnings"] == {"today": "0.00", "total": "0.00", "held": "0.00"}
    assert st["hardware"]["cpu_name"] and "gpus" in st["hardware"]
    paused = client.pause("gaming")
    assert paused["state"] == "paused" and paused["reason"] == "paused by you: gaming"
    assert daemon.agent.status().state is State.PAUSED
    assert client.resume()["state"] != "paused"


def test_settings_round_trip_and_validation(daemon, isolated_dirs) -> None:
    client = ControlClient(isolated_dirs)
    new = client.update_settings(
        {
            "idle_minutes": 12,  # not the default
            "schedule_start": "22:00",
            "schedule_end": "07:00",
            "price_per_gpu_hour": "0.55",
        }
    )
    assert new["idle_minutes"] == 12.0 and client.settings()["price_per_gpu_hour"] == "0.55"
    assert load_settings(isolated_dirs).schedule_end == "07:00"  # saved
    assert daemon.agent.settings.idle_minutes == 12.0  # and in force
    for bad, words in [({"nope": 1}, "unknown setting 'nope'"),
                       ({"idle_minutes": "5"}, "idle_minutes must be a float"),
                       ({"work_on_battery": 1}, "work_on_battery must be a bool"),
                       ({"schedule_start": "25:00"}, "HH:MM"),
                       ({"price_per_gpu_hour": "-1"}, "price_per_gpu_hour"),
                       ({"gpu_memory_fraction": 0}, "gpu_memory_fraction")]:  # fmt: skip
        with pytest.raises(ControlError) as refused:
            client.update_settings(bad)
        assert refused.value.status == 400 and words in str(refused.value)
    assert client.settings()["price_per_gpu_hour"] == "0.55"  # nothing half-applied


def test_logs_are_a_bounded_tail(daemon, isolated_dirs) -> None:
    client = ControlClient(isolated_dirs)
    for i in range(5):
        daemon.agent._info(f"line {i}")
    lines = client.logs(2)
    assert [x["message"] for x in lines] == ["line 3", "line 4"]
    assert client.logs(10, after=lines[-1]["seq"]) == []
    with pytest.raises(ControlError, match="n must be 0 to 500"):
        client.logs(501)


def test_tasks_say_what_became_of_each_newest_first(daemon, isolated_dirs, capsys) -> None:
    """`/tasks` and `gpuflex-node tasks`: the journal's last tasks, a refusal's reason among
    them, never the task's spec or data."""
    journal = daemon.agent.journal
    task = {"job_id": "job-1", "round": 2, "spec": {"name": "private"}}
    journal.record("t-1", "claimed", task=task)
    journal.record("t-1", "done", outcome="uploaded", check="accepted")
    journal.record("t-2", "claimed", task=task)
    journal.record("t-2", "done", outcome="refused", check="refused",
                   refusal="upload refused (norm): too large")  # fmt: skip
    journal.record("t-3", "claimed", task=task)
    client = ControlClient(isolated_dirs)
    rows = client.tasks(2)
    assert [r["id"] for r in rows] == ["t-3", "t-2"]
    assert rows[1] | {"updated": 0} == {
        "id": "t-2", "job_id": "job-1", "round": 2, "state": "done", "outcome": "refused",
        "check": "refused", "refusal": "upload refused (norm): too large", "attempts": 0,
        "updated": 0, "gpu": None,
    }  # fmt: skip
    assert "spec" not in json.dumps(client.tasks(200))
    with pytest.raises(ControlError, match="n must be 0 to 200"):
        client.tasks(201)
    assert raw(isolated_dirs, "GET", "/tasks?n=many")[0] == 400
    assert main(["tasks", "-n", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "task t-3, job job-1 round 2  claimed" in out[0]
    assert out[1].endswith("refused: upload refused (norm): too large")
    assert out[2].endswith("uploaded (accepted)")


def test_login_through_the_api_is_the_one_login(daemon, isolated_dirs) -> None:
    client = ControlClient(isolated_dirs)
    assert client.login("gfx_u_other")["ok"]
    assert Credentials(isolated_dirs).provider_key() == "gfx_u_other"
    with pytest.raises(ControlError, match="start with gfx_u_"):
        client.login("not-a-key")


def test_bad_requests_get_clear_errors(daemon, isolated_dirs) -> None:
    assert raw(isolated_dirs, "GET", "/nowhere") == (404, {"error": "no such endpoint '/nowhere'"})
    status, body = raw(isolated_dirs, "DELETE", "/status")
    assert status == 405 and "takes GET" in body["error"]
    assert raw(isolated_dirs, "POST", "/pause", b"{not json") == (
        400, {"error": "the body must be JSON"})  # fmt: skip
    assert raw(isolated_dirs, "PATCH", "/settings", b"[1]")[0] == 400
    status, body = raw(isolated_dirs, "POST", "/pause", b'{"reason": 3}')
    assert status == 400 and "reason must be a string" in body["error"]
    status, body = raw(isolated_dirs, "POST", "/login", b"x" * 70_000,
                       {"Content-Length": "70000"})  # fmt: skip
    assert status == 413


def test_the_loopback_transport_needs_the_users_token(market, logged_in, isolated_dirs,
                                                      fake_bench) -> None:  # fmt: skip
    d = open_daemon(isolated_dirs, logged_in, fake_bench, transport="tcp").start()
    try:
        ep = Endpoint.read(isolated_dirs)
        assert ep.transport == "tcp" and len(ep.token) > 30
        assert stat.S_IMODE(endpoint_file(isolated_dirs).stat().st_mode) == 0o600
        assert ControlClient(isolated_dirs).pause("tcp")["state"] == "paused"
        conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
        conn.request("GET", "/status")
        resp = conn.getresponse()
        assert resp.status == 401 and "token" in json.loads(resp.read())["error"]
        conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
        conn.request("GET", "/status", headers={"Authorization": "Bearer wrong"})
        assert conn.getresponse().status == 401
        # a supervisor's liveness probe needs no token; readiness (the login's state) does
        for path, status in (("/healthz", 200), ("/readyz", 401)):
            conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
            conn.request("GET", path)
            assert conn.getresponse().status == status, path
    finally:
        d.close()


def test_health_and_readiness_follow_the_marketplace(daemon, isolated_dirs, market) -> None:
    """#36 item 1: the agent's /readyz: logged in, the marketplace answered the last
    heartbeat, the warm task worker up; 503 naming what is not."""
    status, body = raw(isolated_dirs, "GET", "/healthz")
    assert status == 200 and body["status"] == "ok" and body["pid"] == os.getpid()
    wait_for(lambda: raw(isolated_dirs, "GET", "/readyz")[0] == 200, timeout=180)
    _, ready = raw(isolated_dirs, "GET", "/readyz")
    assert set(ready["checks"]) == {"agent", "login", "marketplace", "worker"}
    assert ready["failed"] == [] and ready["warm_workers"][0] in ("warm", "off", "idle")

    market.fail_next(10**6)  # the marketplace answers nothing but 503 now
    wait_for(lambda: raw(isolated_dirs, "GET", "/readyz")[0] == 503, timeout=120)
    _, down = raw(isolated_dirs, "GET", "/readyz")
    assert down["failed"] == ["marketplace"], down
    assert down["checks"]["marketplace"].startswith("the last heartbeat failed")
    with market.lock:
        market._fail.clear()
    wait_for(lambda: raw(isolated_dirs, "GET", "/readyz")[0] == 200, timeout=120)


def test_cli_commands_are_clients_of_the_api(daemon, isolated_dirs, capsys) -> None:
    wait_for(lambda: daemon.agent.status().state is State.IDLE)
    assert main(["pause", "--reason", "rendering"]) == 0
    assert "paused by you: rendering" in capsys.readouterr().out
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"(pid {os.getpid()})" in out and "rendering" in out and "credits" in out
    assert "$" not in out
    assert main(["resume"]) == 0 and daemon.agent.status().state is not State.PAUSED
    assert main(["settings", "--set", "idle_minutes=3", "--set", "work_on_battery=true"]) == 0
    assert daemon.agent.settings.idle_minutes == 3.0 and daemon.agent.settings.work_on_battery
    assert main(["settings", "--set", "idle_minutes=soon"]) == 2
    assert "idle_minutes must be a float" in capsys.readouterr().err
    assert main(["logs", "-n", "3"]) == 0
    assert "settings saved" in capsys.readouterr().out
    assert main(["login", "--key", "gfx_u_viaapi"]) == 0
    assert f"running agent (pid {os.getpid()})" in capsys.readouterr().out
    assert main(["stop"]) == 0
    wait_for(lambda: not daemon.agent.running)


def test_cli_without_a_running_agent(isolated_dirs, capsys) -> None:
    assert main(["pause"]) == 1
    assert "no agent is running" in capsys.readouterr().err
    with pytest.raises(NotRunning):
        ControlClient(isolated_dirs).status()


def test_a_stale_endpoint_file_reads_as_not_running(isolated_dirs) -> None:
    sock = isolated_dirs.data / "run" / "agent.sock"
    sock.parent.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()  # bound, never listening: what a killed agent leaves
    endpoint_file(isolated_dirs).write_text(json.dumps({"transport": "unix", "path": str(sock),
                                                        "pid": 1}))  # fmt: skip
    assert not ControlClient(isolated_dirs).running()


def test_a_damaged_credentials_file_stops_the_agent_saying_so_and_the_status_still_answers(
    market, logged_in, isolated_dirs, fake_bench
) -> None:
    """Issue #32: a damaged credentials.json used to read as 'no keys', and the node would
    register as a new one; now the agent stops in ERROR naming the file, which it leaves."""
    creds = Credentials(isolated_dirs)
    creds.file.write_text('{"provider_key": "gfx_u_')  # cut short
    d = open_daemon(isolated_dirs, logged_in, fake_bench).start()
    try:
        client = ControlClient(isolated_dirs)
        wait_for(lambda: client.status()["state"] == "error")
        st = client.status()
        assert "credentials file" in st["reason"] and str(creds.file) in st["reason"]
        assert st["login"]["provider_key"] is False and str(creds.file) in st["login"]["problem"]
    finally:
        d.close()
    assert market.registrations == []
    assert creds.file.read_text() == '{"provider_key": "gfx_u_'
