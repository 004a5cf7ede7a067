"""How fast a game pauses GPUFlex's task (`python -m bench.run --only pause`).

A real agent (desktop.agent.Agent: its work policy, the bubblewrap sandbox where this machine
has one, the warm task worker and the task runner) trains a task served by the agent-API test
double (tests/desktop/fake_marketplace.py: the marketplace is not what is measured). Mid-task
the agent's policy observation starts reporting another GPU program, as NVML does when a
game starts; the figure is the time from that moment to the task's process being gone and
the agent waiting. The game then quits, and the task resumes from its paused state: the
figures also count the steps trained twice (0 when the pause saved the state) and the time
from the game's end to training again.

The policy check runs at the agent's default interval (POLICY_CHECK_S) and the sandbox at its
default grace (PAUSE_GRACE_S); the goal is 2 s (issue #17). The baseline is the same agent
paused by its owner (`agent.pause()`), which needs no policy check.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "desktop"))  # the agent-API test double
TRIALS = 5
GOAL_S = 2.0


def _task(task_id: str, arch: str) -> Any:
    """A task that trains for a while: the digits MLP, or a CNN whose steps are longer."""
    from fake_marketplace import FakeTask

    from trainer.datasets import load_dataset
    from trainer.hashing import state_hash
    from trainer.models import build_model
    from trainer.spec import parse_spec
    from trainer.updates import encode_state

    model = (
        {"arch": "mlp", "hidden": [256]} if arch == "mlp" else {"arch": "cnn", "channels": [32, 64]}
    )
    batch = 32 if arch == "mlp" else 128
    spec = parse_spec({"name": f"pause-{arch}", "model": model,
                       "optimizer": {"name": "adam", "lr": 0.001},
                       "local": {"steps": 100_000, "batch_size": batch}})  # fmt: skip
    data = load_dataset(spec.dataset)
    net = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    shard = {"x": data.x_train[:1000], "y": data.y_train[:1000]}
    task = {
        "id": task_id, "job_id": "job-pause", "round": 1, "kind": "train",
        "spec": spec.to_dict(), "steps": 100_000, "batch_size": batch, "seed": 1,
        "codec": "none", "proximal_mu": 0.0, "deadline": "2099-01-01T00:00:00Z",
        "model_hash": state_hash(state), "shard_hash": state_hash(shard),
    }  # fmt: skip
    return FakeTask(task, encode_state(state), encode_state(shard), state)


def _wait(cond: Callable[[], bool], what: str, deadline_s: float = 120.0) -> float:
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)
    return time.monotonic()


def _trial(arch: str, by: str, tmp: Path) -> dict[str, Any]:
    from fake_marketplace import PROVIDER_KEY, FakeMarketplace

    from desktop.agent import Agent, State
    from desktop.config import Credentials, Paths, Settings
    from desktop.hardware import detect
    from desktop.policy import Observations

    for name in ("config", "data", "cache"):
        os.environ[f"GPUFLEX_NODE_{name.upper()}_DIR"] = str(tmp / name)
    paths = Paths.default()
    gaming = [False]

    def observe() -> Observations:
        game = [(os.getpid(), 3000)] if gaming[0] else []  # (pid, MB), as NVML lists it
        return Observations(now=dt.datetime.now(), other_gpu_processes=game)

    with FakeMarketplace() as market:
        Credentials(paths).set_provider_key(PROVIDER_KEY)
        settings = Settings(server_url=market.url, node_name="pause-bench", task_wall_s=600,
                            task_memory_mb=4096, first_run_done=True)  # fmt: skip
        from desktop.bench_result import BenchmarkResult

        hw = detect()
        bench = BenchmarkResult(fingerprint=hw.fingerprint(), device="cpu",
                                device_name=hw.cpu_name, quick=True,
                                matmul_tflops={"fp32": 0.1}, memory_gbps=5.0, h2d_gbps=None,
                                d2h_gbps=None, train_samples_per_s={"mlp": 1000.0})  # fmt: skip
        agent = Agent(settings, paths, bench=bench, observe_fn=observe, claim_wait_s=1,
                      idle_sleep_s=0.05)  # fmt: skip
        market.add(_task("t-pause", arch))
        steps: list[int] = []
        agent.subscribe(lambda e: None)
        agent.start()
        try:
            _wait(lambda: (t := agent.status().task) is not None and t.progress > 0.002,
                  "training")  # fmt: skip
            time.sleep(1.0)  # well into the task
            t0 = time.monotonic()
            if by == "policy":
                gaming[0] = True
            else:
                agent.pause("bench")
            state = State.WAITING if by == "policy" else State.PAUSED
            t1 = _wait(lambda: agent.status().state is state and agent.status().task is None,
                       "the pause")  # fmt: skip
            sandbox = agent._sandbox
            assert sandbox is not None
            _wait(lambda: sandbox._running is None, "the task's process to be gone")
            t2 = time.monotonic()
            paused = json.loads((paths.tasks / "t-pause" / "result.json").read_text())
            steps.append(int(paused.get("steps", -1)))
            detail = next((e.message for e in reversed(agent.logs(200))
                           if "interrupted" in e.message), "")  # fmt: skip
            r0 = time.monotonic()
            if by == "policy":
                gaming[0] = False
            else:
                agent.resume()
            r1 = _wait(lambda: any("resuming after" in e.message for e in agent.logs(200)),
                       "the resume")  # fmt: skip
        finally:
            agent.stop()
    return {
        "arch": arch, "by": by, "pause_s": round(max(t1, t2) - t0, 3),
        "paused_at_step": steps[0], "saved": "paused at a step boundary" in detail,
        "resume_s": round(r1 - r0, 3), "warm": sandbox.warm, "isolated": sandbox.isolated,
    }  # fmt: skip


def run() -> dict[str, Any]:
    rows = []
    for arch in ("mlp", "cnn"):
        for by in ("owner", "policy"):
            trials = []
            for i in range(TRIALS):
                with tempfile.TemporaryDirectory(prefix="gpuflex-pause-") as tmp:
                    trials.append(_trial(arch, by, Path(tmp)))
                print(f"pause: {arch}, by the {by}, trial {i + 1}: {trials[-1]['pause_s']} s")
            pauses = [t["pause_s"] for t in trials]
            rows.append({
                "arch": arch, "by": by, "trials": TRIALS,
                "median_pause_s": statistics.median(pauses), "max_pause_s": max(pauses),
                "saved": sum(t["saved"] for t in trials),
                "median_resume_s": statistics.median(t["resume_s"] for t in trials),
                "isolated": trials[0]["isolated"], "warm": trials[0]["warm"],
            })  # fmt: skip
    from desktop.agent import POLICY_CHECK_S
    from desktop.sandbox import PAUSE_GRACE_S

    return {"rows": rows, "policy_check_s": POLICY_CHECK_S, "grace_s": PAUSE_GRACE_S,
            "goal_s": GOAL_S}  # fmt: skip


def render(r: dict[str, Any]) -> list[str]:
    rows = r["rows"]
    sandbox = "bubblewrap" if rows and rows[0]["isolated"] else "no sandbox (bwrap missing)"
    return [
        "## Pausing for a game (the real agent, its sandbox and task runner)",
        "",
        f"`python -m bench.run --only pause`: {TRIALS} trials each; {sandbox}, warm task "
        f"worker. The policy is checked every {r['policy_check_s']:g} s; a task asked to pause "
        f"gets {r['grace_s']:g} s to save its state at a step boundary. The owner's own pause "
        "is the baseline: it needs no policy check. `saved`: trials whose task paused with its "
        "state saved (it then resumes with no step trained twice); `resume`: from the game's "
        "end (or the owner's resume) to the task training again from its paused state.",
        "",
        "| model | paused by | median pause | worst pause | saved | median resume | goal |",
        "|---|---|---:|---:|---:|---:|---|",
        *(
            f"| {x['arch']} | {'a GPU program (policy)' if x['by'] == 'policy' else 'the owner'}"
            f" | {x['median_pause_s']:.2f} s | {x['max_pause_s']:.2f} s | "
            f"{x['saved']}/{x['trials']} | {x['median_resume_s']:.2f} s | "
            f"{'≤ ' + format(r['goal_s'], 'g') + ' s' if x['by'] == 'policy' else 'baseline'} |"
            for x in rows
        ),
        "",
    ]


if __name__ == "__main__":
    print(json.dumps(run()))
