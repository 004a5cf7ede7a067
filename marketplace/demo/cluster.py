"""Starting, killing and restarting GPUFlex's processes on one machine: the web server, the
Celery worker and contributor agents. Used by `gpuflex demo` and by the fault tests.

Nothing here imports Django: every process gets its settings through the environment, so
the same cluster runs on SQLite with the filesystem broker or on PostgreSQL with Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# Short timeouts so that a dead node's work comes back within seconds, not minutes.
FAST_TIMEOUTS = {
    "GPUFLEX_HEARTBEAT_INTERVAL_S": "2",
    "GPUFLEX_NODE_TIMEOUT_S": "8",
    "GPUFLEX_LEASE_TIMEOUT_S": "60",
    "GPUFLEX_ROUND_DEADLINE_S": "60",
    "GPUFLEX_TICK_S": "1",
    "GPUFLEX_STUCK_AGGREGATION_S": "10",
}


SERVICE_VARS = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "GPUFLEX_DATA_DIR",
)


@dataclass(frozen=True)
class NodePlan:
    name: str
    kind: str = "volunteer"  # volunteer | platform
    profile: str = "lan"  # a trainer.sim.network profile the agent's transport simulates
    compute_scale: float = 1.0  # > 1: a GPU that many times slower than this machine
    price: str = "0.40"
    # "sign_flip" | "noise": the agent attacks (desktop/fault_injection.py, fault tests)
    byzantine: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    root: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    # False: ignore DATABASE_URL & co. in this process's environment (the embedded default
    # unless extra_env names services); the fault tests run inside a configured test process
    inherit_services: bool = True
    # this machine's hardware and benchmark, measured once (desktop.probe.save_measured):
    # each agent starts with them (`--measured`) instead of probing in a torch child of its own
    measured: Path | None = None
    # makes a platform node's enrollment token; None: the operator's command, in a process
    # of its own (the demo, which has Django set up already, calls the service instead)
    enroll: Callable[[], str] | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("CELERY_TASK_ALWAYS_EAGER", None)  # a real worker runs the tasks here
        if not self.inherit_services:
            for key in SERVICE_VARS:
                env.pop(key, None)
        env.update(FAST_TIMEOUTS)
        env.update(
            {
                "GPUFLEX_DATA_DIR": str(self.root / "server"),
                "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.base",
                # a server for this machine only: the data dir's own SECRET_KEY will do
                "GPUFLEX_DEV": "1",
                "PYTHONUNBUFFERED": "1",
                # one thread per process: five agents, a worker and a server share the cores
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def _start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{name}.log").open("ab") as log:
            # its own session: a kill reaches the process and every child it started
            self.procs[name] = subprocess.Popen(
                cmd, env=env or self.env(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.root,
            )  # fmt: skip

    def start_web(
        self, threads: int = 24, name: str = "web", port: int | None = None, wait: bool = True
    ) -> None:
        """A web server on the cluster's port, or, behind `start_proxy`, on a port of its own.
        `wait=False`: return at once (`wait_http` later), to start other things meanwhile."""
        port = port or self.port
        self._start(name, [sys.executable, "-m", "marketplace.cli", "serve", "--no-migrate",
                           "--bind", f"127.0.0.1:{port}", "--workers", "1",
                           "--threads", str(threads)])  # fmt: skip
        if wait:
            self.wait_http(name, f"http://127.0.0.1:{port}")

    def start_worker(
        self, name: str = "worker", queues: str = "all", beat: bool = True, **env: str
    ) -> None:
        # one process does the work (solo pool): a prefork pool of one would hold torch twice
        cmd = [sys.executable, "-m", "marketplace.cli", "worker", "--pool", "solo",
               "--loglevel", "WARNING", "--queues", queues]  # fmt: skip
        self._start(name, cmd + ([] if beat else ["--no-beat"]), self.env() | env)

    def start_beat(self) -> None:
        self._start("beat", [sys.executable, "-m", "marketplace.cli", "beat",
                             "--loglevel", "WARNING"])  # fmt: skip

    def start_proxy(self, web_ports: list[int]) -> None:
        """nginx on the cluster's port in front of web servers on `web_ports`, as
        `gpuflex nginx-config` deploys it (docs/deploy.md)."""
        from marketplace.server.proxy import ProxySettings, standalone_nginx

        upstream = ",".join(f"127.0.0.1:{p}" for p in web_ports)
        settings = ProxySettings(listen=f"127.0.0.1:{self.port}", upstream=upstream)
        self._start("proxy", standalone_nginx(settings, self.root / "nginx"))
        self.wait_http("proxy")

    def agent_dirs(self, name: str) -> dict[str, str]:
        base = self.root / "agents" / name
        return {
            "GPUFLEX_NODE_CONFIG_DIR": str(base / "config"),
            "GPUFLEX_NODE_DATA_DIR": str(base / "data"),
            "GPUFLEX_NODE_CACHE_DIR": str(self.root / "agents" / "benchmark-cache"),
            "GPUFLEX_KEYRING": "file",
        }

    def configure_agent(self, plan: NodePlan, provider_key: str) -> None:
        """Write the agent's settings and credentials where its process will look."""
        from desktop.config import Credentials, Paths, Settings, save_settings

        dirs = self.agent_dirs(plan.name)
        paths = Paths(
            config=Path(dirs["GPUFLEX_NODE_CONFIG_DIR"]),
            data=Path(dirs["GPUFLEX_NODE_DATA_DIR"]),
            cache=Path(dirs["GPUFLEX_NODE_CACHE_DIR"]),
        )
        settings = Settings(
            server_url=self.url, node_name=plan.name, kind=plan.kind,
            price_per_gpu_hour=plan.price, idle_minutes=0, task_wall_s=300,
            task_memory_mb=2048, first_run_done=True,
            enrollment_token=self.enrollment_token() if plan.kind == "platform" else "",
        )  # fmt: skip
        save_settings(settings, paths)
        # the agent process reads this file: GPUFLEX_KEYRING=file in its environment
        Credentials(paths, use_keyring=False).set_provider_key(provider_key)

    def enrollment_token(self) -> str:
        """A platform node is enrolled by the operator: a one-use token from the command an
        operator runs (`gpuflex manage create_enrollment_token`)."""
        if self.enroll is not None:
            return self.enroll()
        out = subprocess.run(
            [sys.executable, "-m", "marketplace.manage", "create_enrollment_token",
             "--memo", "demo cluster"],
            env=self.env(), capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return out.stdout.strip()

    def start_agent(self, plan: NodePlan, nice: int = 0) -> None:
        """`nice`: a lower CPU priority for the agent and every process it starts (a bench's
        restarted agent on a shared host, which on real nodes would have a host of its own)."""
        cmd = [sys.executable, "-m", "desktop.cli", "run"]
        if plan.byzantine:  # fault injection's own entry point: no contributor option
            cmd = [sys.executable, "-m", "desktop.fault_injection", "--byzantine", plan.byzantine]
        cmd += ["--server", self.url, "--network-profile", plan.profile, "--claim-wait", "5"]
        if self.measured is not None:
            cmd += ["--measured", str(self.measured)]
        if plan.compute_scale != 1.0:
            cmd += ["--compute-scale", str(plan.compute_scale)]
        if nice:  # nice execs the agent: the same pid, so kill() still reaches its group
            cmd = ["nice", "-n", str(nice), *cmd]
        self._start(f"agent-{plan.name}", cmd, self.env() | self.agent_dirs(plan.name))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        _reap(proc)

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def wait_http(self, name: str = "web", url: str | None = None, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive(name):
                raise RuntimeError(f"{name} exited; see {self.root / 'logs' / f'{name}.log'}")
            try:
                status = httpx.get(f"{url or self.url}/readyz", timeout=2.0).status_code
            except httpx.TransportError:
                status = None
            # The readiness probe: 200 once the server reaches its database, broker and
            # cache. A server without one (404) is ready once its routing answers at all;
            # anything else (503 not ready yet, a proxy's 502 before its upstream is up)
            # means wait. Not the OpenAPI schema: generating it costs seconds of CPU.
            if status in (200, 404):
                return
            time.sleep(0.2)
        raise TimeoutError(f"the web server was not ready within {timeout:.0f} s")

    def close(self) -> None:
        """Agents first (gracefully: they finish their journal), then the server side: every
        process told at once, then each waited for (their shutdowns overlap)."""
        self.stop_agents()
        told = []
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                    told.append(proc)
        self.procs.clear()
        for proc in told:
            _reap(proc)

    def stop_agents(self, with_worker: bool = False) -> None:
        """Every agent, gracefully. `with_worker`: the Celery processes told at the same time
        (for a cluster whose job has ended: the agents talk to the web server as they stop,
        never to the worker, and an idle worker's warm shutdown takes some 5 s of its own)."""
        agents = [n for n in self.procs if n.startswith("agent-")]
        celery = [n for n in self.procs if with_worker and n.startswith(("worker", "beat"))]
        for name in agents + celery:
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for name in agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.procs[name].wait(timeout=15)
            self.kill(name)  # gone already, or stuck: not left running either way
        for name in celery:
            _reap(self.procs.pop(name))

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reap(proc: subprocess.Popen) -> None:
    """Wait for a process told to stop; one stuck past 20 s is killed, its children too."""
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
