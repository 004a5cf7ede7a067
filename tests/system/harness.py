"""A marketplace, its worker and real agents as separate processes, for the fault tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marketplace.client import TERMINAL, Client
from marketplace.demo.cluster import Cluster, NodePlan

# Small and quick: three shards, a handful of rounds, no replicas (platform tier and nodes).
SPEC: dict[str, Any] = {
    "name": "fault-test",
    "seed": 0,
    "dataset": {"kind": "digits", "test_fraction": 0.2},
    "model": {"arch": "mlp", "hidden": [64]},
    "optimizer": {"name": "sgd", "lr": 0.2},
    "local": {"steps": 40, "batch_size": 32},
    "rounds": {"max_rounds": 5, "deadline_s": 60},
    "sharding": {"method": "stratified", "num_shards": 3},
}
# 2 credits an hour (x8 for the fastest-GPU speed factor below): the job's 20 credits pay for
# 75 minutes of metered compute, so a loaded CI machine, whose tasks run slower, never runs a
# job's escrow dry (its last charges would be cut to nothing, and one credited result unpaid)
PRICE = "2.00"
NODES = tuple(NodePlan(f"p{i}", kind="platform", profile="lan", price=PRICE) for i in range(3))


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Guards against hanging only; nothing here asserts how fast."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# The cluster's accounts, credit and platform nodes' enrollment tokens, made by the real
# management commands in one process: each `manage` process costs Django's start (seconds on
# a loaded CI machine), and a test made five to nine of them before its cluster started
SETUP = """
import io, json
from django.core.management import call_command

def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()

call_command("migrate", "--noinput", verbosity=0)
buyer = run("create_account", "buyer")
provider = run("create_account", "prov", "--role", "provider")
run("grant_credit", "buyer", "50")
tokens = [run("create_enrollment_token", "--memo", "system test") for _ in range({tokens})]
print(json.dumps({{"buyer": buyer, "provider": provider, "tokens": tokens}}))
"""


def manage(cluster: Cluster, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "marketplace.manage", *args],
        env=cluster.env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


class System:
    """Set up accounts, start everything, submit the job; `report()` reads the outcome."""

    def __init__(
        self,
        root: Path,
        nodes: tuple[NodePlan, ...] = NODES,
        measured: Path | None = None,
        **env: str,
    ) -> None:
        """`measured`: this machine's figures (`gpuflex-node run --measured`), measured once
        for the session's clusters, as `gpuflex demo` measures once for its five agents: else
        every agent of every test benchmarks the machine as it starts (9 s each, all at
        once on two cores)."""
        # every CPU node counts as the fastest GPU, so each task costs whole micro-credits
        # no platform spot checks: these tests count each unit's one update (no replicas)
        env = {
            "GPUFLEX_REFERENCE_FP32_TFLOPS": "0.0001",
            "GPUFLEX_PLATFORM_SPOT_CHECK_RATE": "0",
        } | env
        self.cluster = Cluster(root, extra_env=env, inherit_services=False)
        self.cluster.measured = measured
        self.nodes = nodes
        platform = sum(plan.kind == "platform" for plan in nodes)
        out = manage(self.cluster, "shell", "-v", "0", "-c", SETUP.format(tokens=platform))
        made = json.loads(out.strip().splitlines()[-1])
        self.buyer_key, self.provider_key = made["buyer"], made["provider"]
        self._tokens: list[str] = made["tokens"]
        self.cluster.enroll = self._enrollment_token

    def _enrollment_token(self) -> str:
        """One of the tokens made with the accounts; past those, from its own command."""
        if self._tokens:
            return self._tokens.pop()
        return manage(self.cluster, "create_enrollment_token", "--memo", "system test").strip()

    def start(self) -> None:
        self.cluster.start_web()
        self.cluster.start_worker()
        for plan in self.nodes:
            self.cluster.configure_agent(plan, self.provider_key)
            self.cluster.start_agent(plan)

    def client(self) -> Client:
        return Client(self.cluster.url, self.buyer_key, timeout=30)

    def submit(self, spec: dict[str, Any] | None = None) -> str:
        with self.client() as c:
            job = c.submit(spec or SPEC, budget="20", tier="platform",
                           max_price_per_gpu_hour="50")  # fmt: skip
        return str(job["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.client() as c:
            return c.job(job_id)

    def rounds(self, job_id: str) -> list[dict[str, Any]]:
        with self.client() as c:
            return c.rounds(job_id)

    def wait_done(self, job_id: str, timeout: float = 300) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            try:
                job = self.job(job_id)
            except Exception:  # the server may be restarting
                return None
            return job if job["status"] in TERMINAL else None

        return wait_for(finished, timeout, f"job {job_id} to finish", every=1.0)

    def report(self, job_id: str) -> dict[str, Any]:
        return json.loads(manage(self.cluster, "job_report", job_id).strip().splitlines()[-1])

    def wait_idle(self, names: list[str] | None = None, timeout: float = 240) -> None:
        """Submit only once every agent is up and polling: on a loaded machine an agent still
        starting (torch import, benchmark) would otherwise see its peers take every task."""
        names = names if names is not None else [plan.name for plan in self.nodes]
        wait_for(
            lambda: all(self.agent_status(n).get("state") == "idle" for n in names),
            timeout,
            "the agents to be idle",
        )

    def agent_status(self, name: str) -> dict[str, Any]:
        path = Path(self.cluster.agent_dirs(name)["GPUFLEX_NODE_DATA_DIR"]) / "status.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        """Everything killed at once: the test has read what it asserts, and a graceful stop
        waits out each agent's long-polled claim and the worker's warm shutdown (5 s each;
        `gpuflex demo` and the agent's own tests stop them gracefully)."""
        for name in list(self.cluster.procs):
            self.cluster.kill(name)


def log_tail(cluster: Cluster, name: str, lines: int = 40) -> str:
    path = cluster.root / "logs" / f"{name}.log"
    return (
        "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
    )
