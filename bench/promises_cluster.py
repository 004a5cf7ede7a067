"""The compute-bound rows of the promises bench (bench.promises_bench), measured through one
marketplace (`gpuflex serve`, a Celery worker) and real `gpuflex-node` agents on simulated wan
links, in one process of its own (it sets up Django on the cluster's database):

    python -m bench.promises_cluster      JSON on the last line of stdout

The job: scaling_bench's byte transformer on five standard-library modules, plain FedAvg
(no adaptation), SGD, strong scaling: a global batch of GLOBAL_BATCH sequences per step split
evenly over the N agents, LOCAL_STEPS steps a round, a round closing on 80 % of its updates,
to a validation loss of TARGET_LOSS.

Emulated GPUs: two cores cannot give ten agents real compute, so each agent emulates a GPU of
a fixed speed by waiting (desktop.emulated_gpu: GPUFLEX_EMULATED_SAMPLE_S in the agents'
environment, a bench hook, no contributor option): a task's compute takes SAMPLE_S per
training sample, the agent waiting out what its real compute did not take. A step then costs
FLOPs-proportional time whatever the host's load: STEP_S for the global batch's step, STEP_S x
b / GLOBAL_BATCH for a node's b sequences (scaling_bench's time model). `--compute-scale`,
which multiplies the real compute, made ten agents on two cores measure the host's contention.

The simulator's prediction of each run is given that run's fixed costs, measured from the
server's own timestamps (trainer.sim.measured: what a task spends besides computing, what a
round spends between its closing update and the next opening), and the failure run's
prediction kills exactly as many nodes a round as the bench does, restarted and resuming
their tasks (trainer.sim.failures).

Rows: scaling (1, 2, 5, 10 agents), failures (10 agents, KILL_FRACTION of them killed with
SIGKILL at every round's opening once they hold its tasks, restarted at once), utilization
(the 10-agent run's, the simulator's definition), centralized (one process, the whole global
batch, paced to 10x one agent's compute, to the same target), upload_to_training (a 60,000-row
CSV job: the upload's first byte to the first lease) and dashboard (a committed job change to
its Server-Sent Events frame arriving at a client of the job's stream, p50 / p99).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from desktop.emulated_gpu import SAMPLE_S_ENV

GLOBAL_BATCH = 100
LOCAL_STEPS = 10
TARGET_LOSS = 2.7
STEP_S = 2.0  # the global batch's step on one emulated GPU
SAMPLE_S = STEP_S / GLOBAL_BATCH  # the emulated GPU's seconds per training sample
NODE_COUNTS = (1, 2, 5, 10)
KILL_FRACTION = 0.2
QUORUM = 0.8
MAX_ROUNDS = 20
JOB_TIMEOUT_S = 420.0
UPLOAD_ROWS = 60_000
UPLOAD_FEATURES = 16
DASHBOARD_CHANGES = 40  # pause/resume commits timed
NODE_TIMEOUT_S = 20
NETWORK = "lan"  # wan: plain FedAvg's fp32 transfers take ~40 s a round (see the report)


# ----------------------------------------------------------------------------- the job


def node_batch(nodes: int) -> int:
    return max(1, round(GLOBAL_BATCH / nodes))


def job_spec(corpus: Path, nodes: int) -> dict[str, Any]:
    from bench.scaling_bench import MODEL, OPTIMIZER, SEQ_LEN

    return {
        "name": f"promises-{nodes}",
        "seed": 0,
        "dataset": {"kind": "text", "path": corpus.name, "seq_len": SEQ_LEN,
                    "test_fraction": 0.1},
        "model": MODEL,
        "optimizer": OPTIMIZER,
        "local": {"steps": LOCAL_STEPS, "batch_size": node_batch(nodes)},
        "rounds": {"max_rounds": MAX_ROUNDS, "quorum": QUORUM, "deadline_s": 120,
                   "target": {"metric": "loss", "value": TARGET_LOSS}},
        "aggregation": {"strategy": "fedavg"},
        "sharding": {"method": "random", "num_shards": nodes},
    }  # fmt: skip


def _setup(corpus: Path, nodes: int) -> Any:
    from trainer.sim.network import WARM_TASKS
    from trainer.sim.setup import prepare
    from trainer.spec import parse_spec

    raw = job_spec(corpus, nodes)
    raw["dataset"] = raw["dataset"] | {"path": str(corpus)}  # the simulator reads it in place
    spec = parse_spec(raw)
    return prepare(spec, nodes, NETWORK, 0, costs=WARM_TASKS)


def real_step_s(corpus: Path, batch: int) -> float:
    """This machine's seconds for one local step on `batch` sequences (one thread, as the
    agents' tasks run), best of three runs of LOCAL_STEPS steps."""
    import torch

    from trainer.local import train_local

    torch.set_num_threads(1)
    setup = _setup(corpus, 1)
    best = math.inf
    for seed in range(3):
        r = train_local(setup.model, setup.initial_state, setup.dataset, setup.spec, seed=seed,
                        steps=LOCAL_STEPS, batch_size=batch)  # fmt: skip
        best = min(best, r.compute_s / LOCAL_STEPS)
    return best


def headroom(corpus: Path, nodes: int) -> dict[str, float]:
    """A step's emulated time on the node's batch against this machine's real one (idle, one
    thread): the emulation holds only while the real compute stays under the emulated, so
    the factor between them is how much host contention it absorbs."""
    real = real_step_s(corpus, node_batch(nodes))
    emulated = SAMPLE_S * node_batch(nodes)
    return {"emulated_step_s": emulated, "real_step_s": real, "headroom": emulated / real}


# ------------------------------------------------------------------ the simulator's side


def simulated_time(corpus: Path, nodes: int, costs: dict[str, float] | None = None,
                   failures: Any = None) -> dict[str, Any]:  # fmt: skip
    """The simulator on the same job: N homogeneous nodes on NETWORK's links, every step
    charged so that the global batch's step takes STEP_S (bench.scaling_bench.charge_compute);
    `costs`: the fixed costs measured on the real run (trainer.sim.measured; None: the
    simulator's defaults, WARM_TASKS); `failures`: trainer.sim.failures.Failures."""
    import dataclasses

    from bench.scaling_bench import charge_compute
    from trainer.sim.federated import run_federated
    from trainer.sim.network import FixedCosts

    setup = _setup(corpus, nodes)
    charge_compute(setup, GLOBAL_BATCH, STEP_S)
    setup.profiles = [dataclasses.replace(p, speed=1.0) for p in setup.profiles]
    if costs is not None:
        setup.costs = FixedCosts(**costs)
    setup.failures = failures
    result, _ = run_federated(setup)
    return {"time_to_target_s": result.time_to_target_s, "rounds": result.rounds_to_target,
            "utilization": result.utilization,
            "costs": dataclasses.asdict(setup.costs)}  # fmt: skip


def round_times(job: Any) -> list[Any]:
    """The job's done rounds as the server timed them (trainer.sim.measured.RoundTimes): the
    opening, each accepted on-time update's arrival and compute, the next opening (the last
    round: the job's end)."""
    from marketplace.rounds.models import Task, TaskResult
    from trainer.sim.measured import RoundTimes

    rounds = list(job.rounds.filter(status="done").order_by("number"))
    out = []
    for i, r in enumerate(rounds):
        nxt = rounds[i + 1].opened_at if i + 1 < len(rounds) else job.finished_at
        if nxt is None:
            continue
        got = TaskResult.objects.filter(task__round=r, late=False).values_list(
            "created_at", "compute_s"
        )
        out.append(RoundTimes(
            opened=r.opened_at.timestamp(),
            arrivals=tuple((at.timestamp(), float(c)) for at, c in got),
            next_opened=nxt.timestamp(),
            units=Task.objects.filter(round=r).count(),
        ))  # fmt: skip
    return out


def simulated_centralized(corpus: Path, nodes: int) -> float | None:
    from bench.scaling_bench import centralized_run
    from trainer.spec import parse_spec

    raw = job_spec(corpus, nodes)
    raw["dataset"] = raw["dataset"] | {"path": str(corpus)}
    raw["local"] = {"steps": LOCAL_STEPS, "batch_size": GLOBAL_BATCH}
    raw["rounds"] = {"max_rounds": 400, "target": raw["rounds"]["target"]}
    result = centralized_run(parse_spec(raw), float(nodes), GLOBAL_BATCH, STEP_S)
    return result.time_to_target_s


# -------------------------------------------------------------------- centralized, real


def centralized(corpus: Path, nodes: int, max_steps: int = 1000) -> dict[str, Any]:
    """One process with `nodes` times one emulated GPU's compute: synchronous SGD steps on the
    whole global batch, each held to STEP_S / nodes (waiting out what the step did not take),
    evaluated every LOCAL_STEPS steps (evaluation not counted: a generous baseline)."""
    import torch

    from trainer.evaluate import evaluate
    from trainer.local import train_local

    torch.set_num_threads(1)
    setup = _setup(corpus, 1)
    state = {k: v.clone() for k, v in setup.initial_state.items()}
    period = LOCAL_STEPS * STEP_S / nodes
    trained_s, steps, loss = 0.0, 0, math.inf
    while steps < max_steps:
        started = time.perf_counter()
        r = train_local(setup.model, state, setup.dataset, setup.spec, seed=steps,
                        steps=LOCAL_STEPS, batch_size=GLOBAL_BATCH)  # fmt: skip
        for k, d in r.delta.items():
            state[k] = state[k] + d
        time.sleep(max(period - (time.perf_counter() - started), 0.0))
        trained_s += time.perf_counter() - started
        steps += LOCAL_STEPS
        setup.model.load_state_dict(state, strict=False)
        loss = evaluate(setup.model, setup.dataset).loss
        if loss <= TARGET_LOSS:
            return {"time_to_target_s": trained_s, "steps": steps, "loss": loss}
    return {"time_to_target_s": None, "steps": steps, "loss": loss}


RESTART_NICE = 19  # a killed agent comes back at this niceness (Killer)


# ------------------------------------------------------------------------ the cluster


class Session:
    """One marketplace; agents started and stopped between jobs."""

    def __init__(self, root: Path, corpus: Path) -> None:
        from marketplace.demo.cluster import Cluster

        os.environ.setdefault("GPUFLEX_WARM_TASKS", "1")
        self.root, self.corpus = root, corpus
        self.cluster = Cluster(root / "cluster")
        self.plans: dict[str, Any] = {}

    def start(self) -> None:
        from marketplace.demo.accounts import create_people
        from marketplace.demo.run import _benchmark, _setup_django

        self.cluster.extra_env["GPUFLEX_REFERENCE_FP32_TFLOPS"] = f"{_benchmark(self.cluster):.6g}"
        # the demo's 8 s lost a working agent's lease on this loaded machine (heartbeats late
        # while its first task's worker started); the product's default is 45 s
        self.cluster.extra_env["GPUFLEX_NODE_TIMEOUT_S"] = str(NODE_TIMEOUT_S)
        # no platform spot checks (as the fault tests): verification replicas are work the
        # simulator does not model, and with one agent online a replica no other node may
        # take holds its round to the deadline (seen here: rounds of 120 s instead of 25 s)
        self.cluster.extra_env["GPUFLEX_PLATFORM_SPOT_CHECK_RATE"] = "0"
        # every agent emulates a GPU of a fixed speed (desktop.emulated_gpu, a bench hook)
        self.cluster.extra_env[SAMPLE_S_ENV] = f"{SAMPLE_S:.9g}"
        _setup_django(self.cluster)
        self.people = create_people()
        self.cluster.start_web()
        self.cluster.start_worker()

    def agents(self, count: int) -> tuple[int, float]:
        """Exactly `count` agents online, each emulating a GPU of SAMPLE_S a sample; returns
        how many came online and the seconds from their start until they were."""
        from marketplace.demo.cluster import NodePlan
        from marketplace.demo.run import _wait_for_agents
        from marketplace.nodes.selectors import online_nodes

        self.cluster.stop_agents()
        end = time.monotonic() + 30
        while online_nodes().exists() and time.monotonic() < end:
            time.sleep(0.25)
        self.plans = {}
        for i in range(count):
            plan = NodePlan(f"gpu-{i}", kind="platform", profile=NETWORK, price="3.00")
            self.plans[plan.name] = plan
            if not (self.cluster.root / "agents" / plan.name / "config").exists():
                self.cluster.configure_agent(plan, self.people["provider"].key)
        started = time.monotonic()
        for plan in self.plans.values():
            self.cluster.start_agent(plan)
        online = _wait_for_agents(count, 120)
        return online, time.monotonic() - started

    def client(self) -> Any:
        from marketplace.client import Client

        return Client(self.cluster.url, self.people["buyer"].key, timeout=600)

    def train(self, nodes: int, on_round: Any = None) -> dict[str, Any]:
        """Submit the job for `nodes` agents and wait for its end; its timing (job_timing)."""
        from django.db.models import Avg

        from marketplace.client import TERMINAL
        from marketplace.demo.summary import job_timing
        from marketplace.jobs.models import Job
        from marketplace.rounds.models import Task, TaskResult
        from trainer.sim.measured import measured_costs

        with self.client() as client:
            job = client.submit(job_spec(self.corpus, nodes), dataset=self.corpus,
                                budget="50.00", tier="platform",
                                max_price_per_gpu_hour="5.00")  # fmt: skip
            end = time.monotonic() + JOB_TIMEOUT_S
            while job["status"] not in TERMINAL and time.monotonic() < end:
                if on_round is not None:
                    on_round(job)
                time.sleep(0.2)
                job = client.job(job["id"])
            if job["status"] not in TERMINAL:
                client.cancel(job["id"])
        row = Job.objects.get(pk=job["id"])
        losses = [r.metrics.get("loss") for r in row.rounds.filter(status="done")
                  .order_by("number")]  # fmt: skip
        lost = Task.objects.filter(round__job=row, attempts__gt=1).count()
        # the compute a task took (the agents' reported compute_s): the emulated LOCAL_STEPS x
        # SAMPLE_S x batch, more only where host load made the real compute take longer
        compute = TaskResult.objects.filter(task__round__job=row).aggregate(s=Avg("compute_s"))
        nominal = LOCAL_STEPS * SAMPLE_S * node_batch(nodes)
        costs = measured_costs(round_times(row), QUORUM)
        return {"status": job["status"], "reached_target": bool(row.reached_target),
                "rounds": row.rounds_done, "loss_per_round": losses, "tasks_retried": lost,
                "task_compute_s": compute["s"], "task_compute_nominal_s": nominal,
                "fixed_costs": dataclasses.asdict(costs) if costs else None,
                "error": job.get("error") or None, **job_timing(row)}  # fmt: skip


class Killer:
    """Failure injection: once per round, when at least `fraction` of the agents hold a task
    (their own status file says so), SIGKILL that many of them (the agent and its sandboxed
    task) and start them again at once: the same node comes back, as a restarted machine
    would, and its lost lease is the marketplace's to notice. Reads nothing but the job's
    state from the API and the agents' status files, so it runs against any cluster."""

    def __init__(self, cluster: Any, plans: dict[str, Any], fraction: float = KILL_FRACTION,
                 seed: int = 0) -> None:  # fmt: skip
        self.cluster, self.plans = cluster, plans
        self.count = max(1, round(fraction * len(plans)))
        self.rng = random.Random(seed)
        self.done: set[int] = set()
        self.killed: list[dict[str, Any]] = []

    def holders(self) -> list[str]:
        """The agents whose status file says they are working on a task."""
        out = []
        for name in sorted(self.plans):
            path = Path(self.cluster.agent_dirs(name)["GPUFLEX_NODE_DATA_DIR"]) / "status.json"
            try:
                task = json.loads(path.read_text(encoding="utf-8")).get("task") or {}
            except (OSError, ValueError, AttributeError):
                continue
            if task.get("phase") in ("downloading", "training"):
                out.append(name)
        return out

    def __call__(self, job: dict[str, Any]) -> list[str]:
        """Kill this round's victims if it has none yet; returns their names."""
        number = int(job.get("rounds_done", 0)) + 1
        if job.get("status") != "running" or number in self.done:
            return []
        holders = self.holders()
        if len(holders) < self.count:
            return []
        self.done.add(number)
        picked = self.rng.sample(holders, self.count)
        for name in picked:
            self.cluster.kill(f"agent-{name}", signal.SIGKILL)
            # restarted at the lowest CPU priority: on real nodes a restarting agent's start-up
            # (its interpreter, its task worker's torch) runs on its own host, not on the
            # survivors' cores, as it must here, where all ten share two
            self.cluster.start_agent(self.plans[name], nice=RESTART_NICE)
        self.killed.append({"round": number, "agents": picked})
        return picked


# ------------------------------------------------------------------ upload and dashboard


def write_rows(path: Path, rows: int = UPLOAD_ROWS) -> Path:
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as out:
        out.write(",".join(f"f{i}" for i in range(UPLOAD_FEATURES)) + ",label\n")
        for _ in range(rows):
            x = [rng.gauss(0.0, 1.0) for _ in range(UPLOAD_FEATURES)]
            out.write(",".join(f"{v:.4f}" for v in x) + f",{int(x[0] + x[1] > 0)}\n")
    return path


def upload_to_training(session: Session, data: Path) -> dict[str, Any]:
    """From the first byte of the buyer's upload (the submit call) to the job's first lease
    (the server's Task.leased_at, same clock); the job is left running for the dashboard."""
    from django.db.models import Min

    from marketplace.rounds.models import Task

    spec = {"name": "upload-to-training", "seed": 0,
            "dataset": {"kind": "csv", "path": data.name, "test_fraction": 0.1},
            "model": {"arch": "mlp", "hidden": [32]}, "optimizer": {"name": "sgd", "lr": 0.1},
            "local": {"steps": 5, "batch_size": 32}, "rounds": {"max_rounds": 50},
            "sharding": {"num_shards": len(session.plans)}}  # fmt: skip
    with session.client() as client:
        started = time.time()
        job = client.submit(spec, dataset=data, budget="20.00", tier="platform",
                            max_price_per_gpu_hour="5.00")  # fmt: skip
        accepted = time.time()
    end = time.monotonic() + 120
    leased = None
    while leased is None and time.monotonic() < end:
        leased = Task.objects.filter(round__job_id=job["id"]).aggregate(t=Min("leased_at"))["t"]
        time.sleep(0.05)
    return {"job_id": job["id"], "rows": UPLOAD_ROWS, "bytes": data.stat().st_size,
            "submit_s": accepted - started,
            "first_lease_s": leased.timestamp() - started if leased else None}  # fmt: skip


def dashboard(session: Session, job_id: str, changes: int = DASHBOARD_CHANGES) -> dict[str, Any]:
    """A job change committed here (pause, resume: services in this process, on the cluster's
    database and doorbell) to the job's SSE frame showing it arriving at a client of the
    stream the job page (and `gpuflex follow`) reads; the clock starts before the service
    call, so the commit's own time is counted."""
    import queue

    from marketplace.jobs.models import Job
    from marketplace.jobs.services import cancel_job, pause_job, resume_job

    frames: queue.Queue[tuple[float, str]] = queue.Queue()

    def listen() -> None:
        with session.client() as client:
            try:
                for state in client.events(job_id):
                    frames.put((time.time(), state["status"]))
            except Exception:  # the stream ends with the job
                pass

    threading.Thread(target=listen, daemon=True).start()
    time.sleep(1.0)  # the stream's first frame (the state now) is not a change
    latencies: list[float] = []
    commits: list[float] = []  # the service call's own time, commit included
    for i in range(changes):
        want, act = ("paused", pause_job) if i % 2 == 0 else ("running", resume_job)
        job = Job.objects.get(pk=job_id)
        started = time.time()
        act(job)
        commits.append(time.time() - started)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                at, status = frames.get(timeout=max(end - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if status == want and at >= started:
                latencies.append(at - started)
                break
    job = Job.objects.get(pk=job_id)
    if job.status in ("running", "paused"):
        cancel_job(job)
    ms = sorted(x * 1000 for x in latencies)
    after = sorted(1000 * (x - c) for x, c in zip(latencies, commits, strict=False))
    return {"changes": changes, "frames_seen": len(ms), "p50_ms": _pct(ms, 50),
            "p99_ms": _pct(ms, 99), "max_ms": ms[-1] if ms else None,
            # from the service call's return (its commit done) rather than its start
            "after_commit_p50_ms": _pct(after, 50), "after_commit_p99_ms": _pct(after, 99),
            "commit_p50_ms": _pct(sorted(1000 * c for c in commits), 50)}  # fmt: skip


def _pct(ordered: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of an ascending list."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(math.ceil(p / 100 * len(ordered)) - 1, 0))]


# ------------------------------------------------------------------------------ a run


def run() -> dict[str, Any]:
    from bench.scaling_bench import stdlib_corpus

    out: dict[str, Any] = {"setup": {
        "global_batch": GLOBAL_BATCH, "local_steps": LOCAL_STEPS, "target_loss": TARGET_LOSS,
        "step_s": STEP_S, "sample_s": SAMPLE_S, "quorum": QUORUM, "network": NETWORK,
        "kill_fraction": KILL_FRACTION, "node_timeout_s": NODE_TIMEOUT_S,
        "emulated_gpu": f"agents emulate a GPU of a fixed speed ({SAMPLE_S_ENV}="
        f"{SAMPLE_S:g}: a task's compute takes {SAMPLE_S:g} s per training sample, so a step "
        f"takes {STEP_S} s x batch / {GLOBAL_BATCH}; the agent waits out what real compute "
        "did not take, desktop/emulated_gpu.py)"}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuflex-promises-") as name:
        tmp = Path(name)
        corpus = stdlib_corpus(tmp)
        out["headroom"] = {n: headroom(corpus, n) for n in NODE_COUNTS}
        print(f"promises: emulation headroom {out['headroom']}", file=sys.stderr, flush=True)
        big = max(NODE_COUNTS)
        out["centralized"] = {"nodes": big, **centralized(corpus, big)}
        print(f"promises: centralized {out['centralized']}", file=sys.stderr, flush=True)
        session = Session(tmp, corpus)
        try:
            session.start()
            out["scaling"] = {}
            for n in NODE_COUNTS:
                online, start_s = session.agents(n)
                out["scaling"][n] = {"online": online, "agents_start_s": start_s,
                                     **session.train(n)}  # fmt: skip
                print(f"promises: {n} agents {out['scaling'][n]}", file=sys.stderr, flush=True)
            out["loadavg"] = {"scaling": os.getloadavg()}
            # the failure run's baseline: the same agents, warm, none killed (the scaling run
            # at `big` paid its freshly started agents' warm-up in its first round)
            out["warm_baseline"] = {"nodes": big, **session.train(big)}
            print(f"promises: warm baseline {out['warm_baseline']}", file=sys.stderr, flush=True)
            killer = Killer(session.cluster, session.plans)
            out["failures"] = {"nodes": big, **session.train(big, on_round=killer),
                               "killed": killer.killed}  # fmt: skip
            out["loadavg"]["failures"] = os.getloadavg()
            print(f"promises: failures {out['failures']}", file=sys.stderr, flush=True)
            up = upload_to_training(session, write_rows(tmp / "rows.csv"))
            out["upload_to_training"] = up
            print(f"promises: upload {up}", file=sys.stderr, flush=True)
            out["dashboard"] = dashboard(session, up["job_id"])
            out["loadavg"]["dashboard"] = os.getloadavg()
            print(f"promises: dashboard {out['dashboard']}", file=sys.stderr, flush=True)
        except Exception as exc:  # what ran is kept; the error is reported beside it
            out["error"] = f"{type(exc).__name__}: {exc}"[:800]
        finally:
            session.cluster.close()
        out |= simulate(corpus, out)
    return out


def simulate(corpus: Path, out: dict[str, Any]) -> dict[str, Any]:
    """The simulator's predictions of the runs in `out`: each given the fixed costs measured
    on its real run; the failure run given the no-failure run's costs (a prediction, not a
    fit; its warm baseline's where it ran) and exactly the kills the bench made, restarted
    agents back after the time agents took to come online."""
    from trainer.round_lifecycle import TICK_S
    from trainer.sim.failures import Failures

    runs = out.get("scaling") or {}
    big = max(NODE_COUNTS)
    sims = {n: simulated_time(corpus, n, (runs.get(n) or {}).get("fixed_costs"))
            for n in NODE_COUNTS}  # fmt: skip
    restart = (runs.get(2) or runs.get(big) or {}).get("agents_start_s")
    failures = Failures(per_round=max(1, round(KILL_FRACTION * big)), back_after_s=restart,
                        detect_s=NODE_TIMEOUT_S + TICK_S)  # fmt: skip
    base = out.get("warm_baseline") or runs.get(big) or {}
    return {"simulated": sims,
            "simulated_centralized_s": simulated_centralized(corpus, big),
            "simulated_warm_baseline": simulated_time(corpus, big, base.get("fixed_costs")),
            "simulated_failures": {
                **simulated_time(corpus, big, base.get("fixed_costs"), failures),
                "failures": dataclasses.asdict(failures)}}  # fmt: skip


def main() -> int:
    print(json.dumps(run(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
