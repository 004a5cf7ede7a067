"""The agent against a protocol double of the marketplace: claim, train for real, upload."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import torch
from fake_marketplace import FakeTask, digits_task

from desktop import task_runner
from desktop.agent import Agent, State
from desktop.bench_result import BenchmarkResult, save_cached
from desktop.client import Backoff
from desktop.config import Credentials, Paths, Settings, save_settings
from desktop.journal import Journal
from trainer.updates import decode_state, encode_state

FAST = Backoff(base_s=0.05, cap_s=0.3, attempts=6)


def wait_for(cond: Callable[[], object], timeout: float = 300.0, what: str = "") -> None:
    """Polls a condition; the timeout only guards against hanging, it asserts nothing fast
    (generous: a loaded 2-core CI machine trains, pauses and resumes a task slowly)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or cond}")


def make_agent(settings: Settings, paths: Paths, bench: BenchmarkResult, **kw: object) -> Agent:
    return Agent(settings, paths, bench=bench, backoff=FAST, claim_wait_s=1,
                 idle_sleep_s=0.1, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_an_upload_refused_after_its_202_is_recorded_and_shown(
    market, logged_in, isolated_dirs, fake_bench
):
    """The server takes the update in (202) and its worker refuses it later: the agent asks,
    learns why, and says so in its journal, its status and its log; it stops asking."""
    market.check_later = True
    market.add(digits_task("t-1"))
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.pipeline.outcomes.gaps_s = (0.05, 0.05, 0.05)  # asked soon: the test stays short
    events = []
    agent.subscribe(events.append)
    agent.start()
    try:
        wait_for(lambda: market.puts == [("t-1", 202)], what="the upload")
        wait_for(lambda: agent.status().completed == 1, what="counted uploaded")
        asked = ("GET", "/api/v1/agent/tasks/t-1/update", 200)
        wait_for(lambda: asked in market.requests, what="the agent to ask")
        reason = "upload refused (norm): The update was rejected: its norm is 1e6, over 1e4."
        market.decide("t-1", "refused", reason)
        wait_for(lambda: agent.status().failed == 1, what="the refusal")
    finally:
        agent.stop()
    st = agent.status()
    assert st.completed == 0 and reason in st.last_error
    assert any(e.level == "error" and reason in e.message for e in agent.logs(500))
    refused = {"id": "t-1", "outcome": "refused", "ok": False, "reason": reason}
    assert ("task_done", refused) in events
    rec = Journal(isolated_dirs.journal).get("t-1")
    assert rec is not None and rec.outcome == "refused" and rec.check == "refused"
    assert rec.refusal == reason
    assert agent.pipeline.outcomes.waiting() == []  # no more asking


def test_a_refused_task_leased_again_is_asked_about_before_it_runs(
    market, logged_in, isolated_dirs, fake_bench
):
    """The server releases a refused upload's task; the same agent may claim it again before
    its next ask is due. The new claim must not bury the refusal: the agent asks at once."""
    market.check_later = True
    market.add(digits_task("t-1"))
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.pipeline.outcomes.gaps_s = (3600.0,)  # never due here: only the claim asks
    events = []
    agent.subscribe(events.append)
    agent.start()
    try:
        wait_for(lambda: market.puts == [("t-1", 202)], what="the upload")
        reason = "upload refused (norm): The update was rejected: its norm is 1e6, over 1e4."
        market.decide("t-1", "refused", reason)
        market.requeue("t-1")
        wait_for(lambda: len(market.puts) == 2 and _check(isolated_dirs, "t-1") == "checking",
                 what="the task run again and its new upload watched")  # fmt: skip
    finally:
        agent.stop()
    asks = [r for r in market.requests if r[:2] == ("GET", "/api/v1/agent/tasks/t-1/update")]
    assert len(asks) == 1
    refused = {"id": "t-1", "outcome": "refused", "ok": False, "reason": reason}
    assert ("task_done", refused) in events
    entries = [json.loads(line) for line in isolated_dirs.journal.read_text().splitlines()]
    told = [i for i, e in enumerate(entries) if e.get("refusal") == reason]
    claims = [i for i, e in enumerate(entries) if e["state"] == "claimed" and e.get("task")]
    assert len(told) == 1 and len(claims) == 2 and claims[0] < told[0] < claims[1]
    rec = Journal(isolated_dirs.journal).get("t-1")
    assert rec is not None and rec.check_asks == 0 and not rec.refusal  # the new upload's


def _check(dirs: Paths, task_id: str) -> str | None:
    rec = Journal(dirs.journal, readonly=True).get(task_id)
    return None if rec is None else rec.check


def test_an_upload_never_decided_is_asked_about_a_bounded_number_of_times(
    market, logged_in, isolated_dirs, fake_bench
):
    market.check_later = True
    market.add(digits_task("t-1"))
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.pipeline.outcomes.gaps_s = (0.05, 0.05, 0.05)
    agent.start()
    try:
        wait_for(lambda: _check(isolated_dirs, "t-1") == "unknown",
                 what="the agent to give up asking")  # fmt: skip
    finally:
        agent.stop()
    asks = [r for r in market.requests if r[:2] == ("GET", "/api/v1/agent/tasks/t-1/update")]
    assert len(asks) == 3  # one per gap, then no more
    assert agent.status().completed == 1  # uploaded, as far as anyone knows
    assert any("no longer asking" in e.message for e in agent.logs(500))


def test_claims_trains_and_uploads_through_outages(market, logged_in, isolated_dirs, fake_bench):
    """One real task end to end, with 5xx answers and dropped connections along the way."""
    market.add(digits_task("t-1"))
    market.fail_next(3, 503)
    market.drop_next(2)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    events = []
    agent.subscribe(events.append)
    agent.start()
    try:
        wait_for(lambda: "t-1" in market.accepted(), what="the update")
        wait_for(lambda: agent.status().completed == 1, what="completion")
    finally:
        agent.stop()
    assert [s for _, _, s in market.requests].count(503) == 3
    assert any("retrying" in e.message for e in agent.logs(500))
    assert market.registrations and market.registrations[0]["name"] == "test-node"
    assert market.registrations[0]["benchmark"]["fp32_tflops"] == 0.1
    assert market.registrations[0]["hardware"]["memory_gb"] > 0  # the server schedules on it
    assert all(None not in h["metrics"].values() for h in market.heartbeats)
    assert market.puts == [("t-1", 201)]
    assert any(h.get("task_id") == "t-1" for h in market.heartbeats)
    assert ("task_done", {"id": "t-1", "outcome": "uploaded", "ok": True}) in events
    assert Credentials(isolated_dirs).node_key(market.url).startswith("gfx_n_")
    assert not (isolated_dirs.tasks / "t-1").exists(), "the task folder is cleaned up"
    rec = Journal(isolated_dirs.journal).get("t-1")
    assert rec is not None and rec.state == "done" and rec.outcome == "uploaded"


def test_the_link_is_timed_before_the_first_heartbeat(market, logged_in, isolated_dirs, fake_bench):
    """The first round is planned on measured rates: the agent's link test runs as it starts,
    and its very first heartbeat carries them."""
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: market.heartbeats, what="a heartbeat")
    finally:
        agent.stop()
    network = market.heartbeats[0]["network"]
    assert network["up_mbps"] > 0 and network["down_mbps"] > 0
    probes = [(m, p.split("?")[0]) for m, p, s in market.requests if s == 200]
    assert ("GET", "/api/v1/agent/probe") in probes and ("POST", "/api/v1/agent/probe") in probes


def _huge_lm_task(task_id: str) -> FakeTask:
    """A task whose model (a 48-layer, 4096-wide transformer) cannot fit a small memory cap."""
    t = digits_task(task_id)
    t.task["spec"]["model"] = {"arch": "transformer", "d_model": 4096, "n_layers": 48,
                               "n_heads": 64}  # fmt: skip
    tokens = torch.zeros((8, 16), dtype=torch.int64)
    t.shard = encode_state({"x": tokens, "y": tokens})
    t.task["model_hash"] = t.task["shard_hash"] = ""
    return t


def test_over_memory_or_time_is_killed_reported_and_work_goes_on(
    market, logged_in, isolated_dirs, fake_bench
):
    logged_in.task_memory_mb = 1200  # room for torch itself, not for the huge model
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    oom = _huge_lm_task("t-oom")
    market.add(oom)
    agent.start()
    try:
        wait_for(lambda: oom.failed, what="the oom report")
        agent.update_settings(replace(agent.settings, task_wall_s=1))
        slow = digits_task("t-slow", steps=100_000)
        market.add(slow)
        wait_for(lambda: slow.failed, what="the timeout report")
        agent.update_settings(replace(agent.settings, task_wall_s=120))
        market.add(digits_task("t-good"))
        wait_for(lambda: "t-good" in market.accepted(), what="the next task")
    finally:
        agent.stop()
    assert oom.failed[0]["reason"] == "oom", oom.failed
    assert slow.failed[0]["reason"] == "timeout", slow.failed
    assert "time limit" in slow.failed[0]["detail"]
    assert agent.status().failed == 2 and agent.status().completed == 1


def test_pause_stops_claiming_and_resume_restarts_it(market, logged_in, isolated_dirs, fake_bench):
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: agent.status().state is State.IDLE, what="idle")
        agent.pause()
        wait_for(lambda: agent.status().state is State.PAUSED)
        time.sleep(1.5)  # lets a long poll that was already in flight end
        claims = market.claims
        time.sleep(0.5)
        assert market.claims == claims, "a paused agent does not claim"
        agent.resume()
        wait_for(lambda: market.claims > claims, what="claims after resume")
        assert agent.status().state is not State.PAUSED
    finally:
        agent.stop()
    assert agent.status().state is State.STOPPED


def test_restart_after_upload_before_journal_does_not_submit_twice(
    market, logged_in, isolated_dirs, fake_bench
):
    """A crash between the upload and its journal entry: the retry sends identical bytes."""
    task = digits_task("t-4")
    market.add(task)
    key = market.register_node()
    Credentials(isolated_dirs).set_node_key(market.url, key)
    with market.lock:  # leased to us, and our update already accepted by the server
        market.queue.remove("t-4")
        task.leased_to = market.nodes[key]
    update = encode_state({k: torch.full_like(v, 1e-3) for k, v in task.reference.items()})
    task.accepted = update
    journal = Journal(isolated_dirs.journal)
    journal.record("t-4", "claimed", task=task.task)
    journal.record("t-4", "ready")
    folder = isolated_dirs.tasks / "t-4"
    folder.mkdir(parents=True)
    (folder / "update.safetensors").write_bytes(update)
    journal.record("t-4", "trained", update_sha256=hashlib.sha256(update).hexdigest(),
                   metrics={"loss": 1.0})  # fmt: skip
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: agent.status().completed == 1, what="the repeated upload")
    finally:
        agent.stop()
    assert market.puts == [("t-4", 200)]  # same bytes: the server answers 200, no duplicate
    assert Journal(isolated_dirs.journal).get("t-4").outcome == "uploaded"


def _run_node(paths: Paths) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["GPUFLEX_NODE_CONFIG_DIR"] = str(paths.config)
    env["GPUFLEX_NODE_DATA_DIR"] = str(paths.data)
    env["GPUFLEX_NODE_CACHE_DIR"] = str(paths.cache)
    return subprocess.Popen(
        [sys.executable, "-m", "desktop.cli", "run", "--claim-wait", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2], start_new_session=True,
    )  # fmt: skip


def _maps_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (RSS counts it, whatever imported it)."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_kill_mid_task_and_restart_neither_loses_nor_duplicates(
    market, logged_in, isolated_dirs, fake_bench
):
    market.add(digits_task("t-5", steps=600, rows=300))
    save_settings(logged_in, isolated_dirs)
    save_cached(isolated_dirs.cache, fake_bench)
    node = _run_node(isolated_dirs)
    try:
        # "ready" with an attempt counted: the sandbox is training when we pull the plug
        wait_for(
            lambda: (
                (r := Journal(isolated_dirs.journal, readonly=True).get("t-5")) is not None
                and r.attempts >= 1
                and r.state == "ready"
            ),
            what="training to start",
        )
        if sys.platform == "linux":  # torch lives in the sandboxed task, not in the agent
            # waited for, not asserted at once: on a loaded machine the task (or the warm
            # worker it forks from) may still be importing torch when the journal says ready
            wait_for(lambda: any(_maps_torch(k.pid) for k in
                                 psutil.Process(node.pid).children(recursive=True)),
                     what="a task process holding torch")  # fmt: skip
            assert not _maps_torch(node.pid), "the agent process imported torch"
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()
        assert "t-5" not in market.accepted()
        node = _run_node(isolated_dirs)
        wait_for(lambda: "t-5" in market.accepted(), timeout=120, what="the resumed task")
        wait_for(lambda: Journal(isolated_dirs.journal, readonly=True).get("t-5").state == "done")
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(30)
    assert market.puts == [("t-5", 201)]
    assert market.tasks["t-5"].failed == []
    assert len([r for r in market.requests if r[1].endswith("/claim?wait=1") and r[2] == 200]) == 1


def test_work_policy_holds_the_agent_back(market, logged_in, isolated_dirs, fake_bench):
    import datetime as dt

    from desktop.policy import Observations

    gaming = [True]

    def observe() -> Observations:
        procs = [(4242, 3000)] if gaming[0] else []
        return Observations(now=dt.datetime.now(), other_gpu_processes=procs)

    agent = make_agent(logged_in, isolated_dirs, fake_bench, observe_fn=observe)
    agent.start()
    try:
        wait_for(lambda: agent.status().state is State.WAITING, what="waiting")
        assert "another program uses the GPU" in agent.status().reason
        assert market.claims == 0
        # the marketplace hears that the node waits, and why (buyers see it on their job)
        wait_for(lambda: any(b["state"] == "waiting" for b in market.heartbeats), what="beat")
        beat = next(b for b in market.heartbeats if b["state"] == "waiting")
        assert beat["reason"] == agent.status().reason
        gaming[0] = False
        wait_for(lambda: market.claims > 0, what="claims once the game quits")
    finally:
        agent.stop()


def test_a_game_starting_mid_task_preempts_it_and_work_resumes_later(
    market, logged_in, isolated_dirs, fake_bench, tmp_path, monkeypatch
):
    import datetime as dt

    from desktop import sandbox
    from desktop.policy import Observations

    # a loaded machine may take longer than the 1 s default to reach the task's next step:
    # this is a test of the hand-over, not of the machine's speed (`bench.run --only pause`)
    monkeypatch.setattr(sandbox, "PAUSE_GRACE_S", 60.0)

    gaming = [False]

    def observe() -> Observations:
        return Observations(now=dt.datetime.now(),
                            other_gpu_processes=[(4242, 3000)] if gaming[0] else [])  # fmt: skip

    agent = make_agent(logged_in, isolated_dirs, fake_bench, observe_fn=observe,
                       policy_check_s=0.1)  # fmt: skip
    market.add(digits_task("t-7", steps=3000, rows=300))
    agent.start()
    try:
        wait_for(lambda: (t := agent.status().task) is not None and t.phase == "training")
        gaming[0] = True
        wait_for(lambda: agent.status().state is State.WAITING, what="preemption")
        rec = Journal(isolated_dirs.journal, readonly=True).get("t-7")
        assert rec.state == "ready" and rec.attempts == 0  # kept, to run again
        assert "t-7" not in market.accepted()
        gaming[0] = False
        wait_for(lambda: "t-7" in market.accepted(), what="the task after the game")
    finally:
        agent.stop()
    assert market.puts == [("t-7", 201)] and market.tasks["t-7"].failed == []
    messages = [e.message for e in agent.logs(500)]
    # it paused at a step and went on from there, to the update an unpaused run makes
    assert any("interrupted" in m and "paused at a step boundary" in m for m in messages)
    assert any("resuming after" in m for m in messages), messages
    expected = _unpaused_update(digits_task("t-7", steps=3000, rows=300), tmp_path)
    sent = decode_state(market.accepted()["t-7"])[0]
    assert sent.keys() == expected.keys()
    assert all(torch.equal(sent[k], expected[k]) for k in expected)


def test_a_task_held_past_its_deadline_while_the_game_goes_on_goes_back_at_once(
    market, logged_in, isolated_dirs, fake_bench
):
    """Heartbeats keep a held task's lease alive: a long game must not hold its round up."""
    import datetime as dt

    from desktop.policy import Observations

    gaming = [False]

    def observe() -> Observations:
        return Observations(now=dt.datetime.now(),
                            other_gpu_processes=[(4242, 3000)] if gaming[0] else [])  # fmt: skip

    task = digits_task("t-late", steps=100_000, rows=300)
    market.add(task)
    agent = make_agent(logged_in, isolated_dirs, fake_bench, observe_fn=observe,
                       policy_check_s=0.1)  # fmt: skip
    overdue = [False]  # the task's deadline passes when the test says, not by the clock
    agent.pipeline.deadline_passed = lambda _task: overdue[0]  # type: ignore[method-assign]
    agent.start()
    try:
        wait_for(lambda: (t := agent.status().task) is not None and t.phase == "training")
        gaming[0] = True
        wait_for(lambda: agent.status().state is State.WAITING, what="preemption")
        assert not task.failed  # held while its deadline has not passed
        claims = market.claims
        overdue[0] = True
        wait_for(lambda: task.failed, what="the overdue task handed back")
        wait_for(lambda: Journal(isolated_dirs.journal, readonly=True).get("t-late").state
                 == "done", what="the journal")  # fmt: skip
        wait_for(lambda: agent.status().state is State.WAITING, what="still waiting")
        assert "another program uses the GPU" in agent.status().reason
        assert market.claims == claims  # handed back while the game goes on: nothing new taken
    finally:
        agent.stop()
    assert task.failed[0]["reason"] == "cancelled"
    assert "not run by its deadline: another program uses the GPU" in task.failed[0]["detail"]


def _unpaused_update(t, tmp_path):
    from desktop.sandbox import Limits, Sandbox

    folder = tmp_path / "unpaused"
    folder.mkdir()
    (folder / "task.json").write_text(json.dumps(t.task))
    (folder / "model.safetensors").write_bytes(t.model)
    (folder / "shard.safetensors").write_bytes(t.shard)
    # in a sandbox, as the agent's run was: the same torch threads, so the same float sums
    with Sandbox(Limits(wall_s=120, memory_mb=4096)) as sandbox:
        assert sandbox.run_task(folder).ok
    return decode_state((folder / "update.safetensors").read_bytes())[0]


def test_a_journaled_task_whose_lease_is_gone_is_dropped(
    market, logged_in, isolated_dirs, fake_bench
):
    """After a long outage the server gave the task to someone else: 404, not a retry loop."""
    task = digits_task("t-8")
    Journal(isolated_dirs.journal).record("t-8", "claimed", task=task.task)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: (r := Journal(isolated_dirs.journal, readonly=True).get("t-8"))
                 is not None and r.state == "done", what="the lost task dropped")  # fmt: skip
        wait_for(lambda: market.claims > 0, what="claiming new work")
    finally:
        agent.stop()
    assert Journal(isolated_dirs.journal, readonly=True).get("t-8").outcome == "lost"


def test_a_corrupt_download_is_fetched_again_and_a_second_one_fails_the_task(
    market, logged_in, isolated_dirs, fake_bench
):
    """The sandboxed runner checks the inputs against the task's hashes (the agent parses no
    tensor itself); a mismatch is fetched once more, then reported."""
    once, twice = digits_task("t-9"), digits_task("t-10")
    once.corrupt_models, twice.corrupt_models = 1, 2
    market.add(twice)  # first: the same inputs, once checked, would come from the cache
    market.add(once)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: "t-9" in market.accepted() and twice.failed, what="both outcomes")
    finally:
        agent.stop()
    assert once.model_gets == 2 and once.failed == []
    assert twice.model_gets == 2 and twice.failed[0]["reason"] == "crashed", twice.failed
    assert "inputs corrupt after two downloads" in twice.failed[0]["detail"]
    assert "does not match the task's content hash" in twice.failed[0]["detail"]
    assert any("download 1 is corrupt" in e.message for e in agent.logs(500))


def test_a_byzantine_agent_says_so_and_sends_the_flipped_update(
    market, logged_in, isolated_dirs, fake_bench, tmp_path
):
    """`python -m desktop.fault_injection --byzantine` reaches the sandboxed runner (the agent
    has no torch): the upload is the honest update of the same task, times -10."""
    honest = tmp_path / "honest"
    honest.mkdir()
    t = digits_task("t-11")
    (honest / "task.json").write_text(json.dumps(t.task))
    (honest / "model.safetensors").write_bytes(t.model)
    (honest / "shard.safetensors").write_bytes(t.shard)
    assert task_runner.run(honest) == task_runner.EXIT_OK
    good = decode_state((honest / "update.safetensors").read_bytes())[0]

    market.add(digits_task("t-11"))
    settings = replace(logged_in, extra={"byzantine": "sign_flip:10.0"})
    agent = make_agent(settings, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: "t-11" in market.accepted(), what="the update")
    finally:
        agent.stop()
    sent = decode_state(market.accepted()["t-11"])[0]
    for name, v in sent.items():
        torch.testing.assert_close(v, -10.0 * good[name])
    warning = next(e for e in agent.logs(500) if "FAULT INJECTION" in e.message)
    assert warning.level == "warning" and "sign_flip" in warning.message


def _gets(market, what: str) -> int:
    return sum(1 for m, path, _ in market.requests if m == "GET" and path.endswith(f"/{what}"))


def test_inputs_come_from_the_cache_by_content_hash(market, logged_in, isolated_dirs, fake_bench):
    """A shard (and a round's model) is fetched once per node: later tasks with the same
    hashes read it from the agent's cache, and a cached file gone bad is fetched anew."""
    first, second = digits_task("t-11"), digits_task("t-12", seed=2)  # same model and shard
    market.add(first)
    market.add(second)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: {"t-11", "t-12"} <= set(market.accepted()), what="both tasks")
        assert _gets(market, "shard") == _gets(market, "model") == 1
        shard = agent.inputs._path(first.task["shard_hash"])
        assert shard is not None and shard.read_bytes() == first.shard
        shard.write_bytes(first.shard[:-1] + bytes([first.shard[-1] ^ 0xFF]))  # gone bad
        market.add(digits_task("t-13", seed=3))
        wait_for(lambda: "t-13" in market.accepted(), what="the third task")
    finally:
        agent.stop()
    # the runner says the inputs are corrupt, not which: both are fetched anew
    assert _gets(market, "shard") == _gets(market, "model") == 2
    assert shard.read_bytes() == first.shard  # checked again, and kept again


def test_a_shard_with_the_same_hash_from_another_job_is_not_downloaded(
    market, logged_in, isolated_dirs, fake_bench
):
    """The same dataset submitted again (another job, the same shard bytes): the node
    that trained on it already serves the second job's task from its cache."""
    first, second = digits_task("t-21"), digits_task("t-22", seed=2)
    second.task["job_id"] = "job-2"
    assert second.task["shard_hash"] == first.task["shard_hash"]
    market.add(first)
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: "t-21" in market.accepted(), what="the first job's task")
        assert _gets(market, "shard") == 1
        market.add(second)
        wait_for(lambda: "t-22" in market.accepted(), what="the second job's task")
    finally:
        agent.stop()
    assert _gets(market, "shard") == 1  # the second task did not download it again
    assert market.tasks["t-22"].accepted is not None


class _BeatRecorder:
    """Stands in for the client: keeps each heartbeat's body."""

    node_key = "gfx_n_test"

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []

    def heartbeat(self, body: dict[str, object]) -> dict[str, object]:
        self.bodies.append(body)
        return {"heartbeat_interval_s": 5.0}


def test_a_heartbeat_names_every_task_the_node_holds(logged_in, isolated_dirs, fake_bench):
    """Prefetched tasks and one whose update still uploads keep their leases as the trained
    one does: the heartbeat names all the journal's open tasks (at most HEARTBEAT_TASKS),
    and none it has finished."""
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    recorder = _BeatRecorder()
    agent.client = recorder  # type: ignore[assignment]
    agent.journal.record("t-done", "claimed", task={"id": "t-done"})
    agent.journal.record("t-done", "done", outcome="uploaded")
    for i in range(40):
        agent.journal.record(f"t-{i}", "claimed", task={"id": f"t-{i}"})
    agent.journal.record("t-0", "ready")
    agent.presence.beat()
    held = recorder.bodies[-1]["task_ids"]
    assert held == [f"t-{i}" for i in range(32)]
    assert "t-done" not in held


def test_an_emulated_gpu_reports_the_compute_its_work_fixes(
    market, logged_in, isolated_dirs, fake_bench, monkeypatch
):
    """With the bench's emulated GPU (GPUFLEX_EMULATED_SAMPLE_S) a task's compute is what its
    samples fix (20 steps x 32 samples x 0.001 s = 0.64 s), or the real compute where a
    loaded host took longer: never a multiple of the real compute."""
    from desktop.emulated_gpu import SAMPLE_S_ENV

    monkeypatch.setenv(SAMPLE_S_ENV, "0.001")
    market.add(digits_task("t-e"))
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: "t-e" in market.accepted(), what="the update")
    finally:
        agent.stop()
    rec = Journal(isolated_dirs.journal).get("t-e")
    assert rec is not None and rec.metrics["steps"] == 20
    assert rec.metrics["compute_s"] >= 20 * 32 * 0.001


def test_a_dp_sgd_task_trains_in_the_warm_worker_with_opacus_imported_for_it(
    market, logged_in, isolated_dirs, fake_bench
):
    """A DP-SGD task (`privacy.mode: sample`) asks the warm worker for Opacus before it is
    forked (desktop.task_zygote.ON_DEMAND), and trains and uploads as any task does."""
    privacy = {"clip_norm": 0.5, "mode": "sample", "noise_multiplier": 0.5}
    market.add(digits_task("dp-1", steps=4, privacy=privacy))
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    agent.start()
    try:
        wait_for(lambda: "dp-1" in market.accepted(), what="the DP-SGD update")
    finally:
        agent.stop()
    assert agent._sandbox.imports == ("trainer.dp_sgd",)
    rec = Journal(isolated_dirs.journal, readonly=True).get("dp-1")
    assert rec is not None and rec.outcome == "uploaded"
