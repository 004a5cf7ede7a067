"""`gpuflex demo`: start the marketplace, five agents and a buyer's job; report the outcome.

The marketplace runs on whatever DATABASE_URL / CELERY_BROKER_URL say (by default SQLite and
the filesystem broker under the demo's folder). Every part is a separate process, talking
over HTTP and the broker exactly as on separate machines; each agent simulates its network
(and, for some, a slower GPU) in its own transport.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from marketplace.demo.cluster import Cluster, NodePlan

# Prices are per reference GPU-hour, and the demo takes this machine as the reference GPU.
NODES = (
    NodePlan("platform-lan", kind="platform", profile="lan", price="3.00"),
    NodePlan("volunteer-wan-a", profile="wan", price="2.00"),
    NodePlan("volunteer-wan-b", profile="wan", compute_scale=2.0, price="1.60"),
    NodePlan("volunteer-wan-c", profile="wan", compute_scale=3.0, price="1.20"),
    NodePlan("volunteer-flaky", profile="flaky", price="1.80"),
)
SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo-digits.yaml"
MARKER = ".gpuflex-demo"
# how long the demo waits for its agents to come online before it submits the job
AGENTS_READY_S = 90.0


@dataclass
class Options:
    data_dir: Path
    port: int = 0
    target: float = 0.95
    budget: str = "1.00"
    timeout_s: float = 900.0
    serve: bool = False
    quiet: bool = False  # progress to stderr only (for --json)
    spec: Path = SPEC
    nodes: tuple[NodePlan, ...] = NODES
    chain: bool = False  # settle on a Hardhat node the demo starts (marketplace/demo/chain.py)


def _fresh(root: Path) -> None:
    """Start from nothing, but only ever delete a folder an earlier demo made."""
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            raise SystemExit(f"{root} exists and is not a demo folder; choose --data-dir")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by gpuflex demo; deleted by the next run\n")


def _setup(cluster: Cluster, plans: tuple[NodePlan, ...] | list[NodePlan]) -> dict[str, Any]:
    """Migrate, make the demo's people and an enrollment token per platform node, in a
    process of its own (marketplace/demo/setup.py): the demo holds no Django while the
    cluster runs. Returns the people (accounts.Login by role); the tokens are handed to the
    cluster, one per platform node it configures."""
    from marketplace.demo.accounts import Login

    count = sum(plan.kind == "platform" for plan in plans)
    out = subprocess.run(
        [sys.executable, "-m", "marketplace.demo.setup", str(count)],
        env=cluster.env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"gpuflex demo: setting up the database failed:\n{out.stderr[-4000:]}")
    made = json.loads(out.stdout.strip().splitlines()[-1])
    tokens = iter(made["tokens"])
    cluster.enroll = lambda: next(tokens)  # the operator's tokens, made by the setup
    return {role: Login(**login) for role, login in made["people"].items()}


def _benchmark(cluster: Cluster) -> float:
    """Measure this machine once for all agents (instead of five torch probes at once on
    two cores): they start with these figures (`gpuflex-node run --measured`), and its fp32
    throughput is the demo's reference GPU."""
    from desktop.probe import probe, save_measured

    cache = Path(cluster.agent_dirs("any")["GPUFLEX_NODE_CACHE_DIR"])
    hw, result, _ = probe(cache, quick=True)  # in a child: the demo itself holds no torch
    assert result is not None
    cluster.measured = cache / "measured.json"
    save_measured(cluster.measured, hw, result)
    return float(result.matmul_tflops.get("fp32") or 1.0)


def run(opts: Options) -> dict[str, Any]:
    from marketplace.client import Client, spec_files
    from marketplace.demo.progress import follow

    out = sys.stderr if opts.quiet else sys.stdout
    started = time.monotonic()
    # seconds from the start at which each step ended: where the start-up time goes (the
    # summary's `phases_s`; bench/footprint_bench.py reports them beside the wall time)
    phases: dict[str, float] = {}

    def done(step: str) -> None:
        phases[step] = round(time.monotonic() - started, 2)

    # a TERM (a supervisor, a test's timeout) still stops the processes the demo started
    signal.signal(signal.SIGTERM, _interrupt)
    root = opts.data_dir.resolve()
    _fresh(root)
    cluster = Cluster(root, **({"port": opts.port} if opts.port else {}))
    chain = contextlib.ExitStack()  # the Hardhat node of --chain, stopped after the cluster
    try:
        print(f"GPUFlex demo in {root} (logs in {root / 'logs'})", file=out)
        if opts.chain:
            cluster.extra_env |= _start_chain(chain, root, out)
        reference = _benchmark(cluster)
        done("benchmark")
        cluster.extra_env["GPUFLEX_REFERENCE_FP32_TFLOPS"] = f"{reference:.6g}"
        # the web server's start-up (imports, its worker's boot) overlaps the migrations:
        # nothing reaches it before the agents start, after both
        cluster.start_web(wait=False)
        people = _setup(cluster, opts.nodes)
        done("migrate")
        cluster.start_worker()
        for plan in opts.nodes:
            cluster.configure_agent(plan, people["provider"].key)
        done("accounts")
        cluster.wait_http("web")
        done("web_ready")
        for plan in opts.nodes:
            cluster.start_agent(plan)
        print(f"marketplace at {cluster.url}; {len(opts.nodes)} agents started", file=out)
        done("agents_started")
        online = _wait_for_agents(cluster.url, people["provider"].key, len(opts.nodes),
                                  AGENTS_READY_S)  # fmt: skip
        done("agents_online")
        print(f"{online} of {len(opts.nodes)} agents online", file=out)
        spec = yaml.safe_load(opts.spec.read_text(encoding="utf-8"))
        spec["rounds"]["target"]["value"] = opts.target
        with Client(cluster.url, people["buyer"].key) as client:
            # the spec file's own files (an exported model's program, a dataset) go with it
            job = client.submit(spec, budget=opts.budget, tier="hybrid",
                                max_price_per_gpu_hour="5.00",
                                uploads=spec_files(opts.spec))  # fmt: skip
            print(f"buyer submitted job {job['id']} with a budget of {opts.budget}", file=out)
            done("submitted")
            job = follow(client, job, opts.timeout_s, out)
            done("job_ended")
            if not job["rounds_done"]:  # nothing to download: the reason was said above
                raise SystemExit(f"gpuflex demo: the job {job['status']} before any round "
                                 f"finished: {job.get('error') or 'no reason given'} (logs in "
                                 f"{root / 'logs'})")  # fmt: skip
            model_path, _ = client.download(job["id"], root / "model")
        if not opts.serve:
            # their work is done (and the money settled with the job's last round, unless
            # --chain's batches are still to come); the summary's replay needs the memory
            cluster.stop_agents(with_worker=not opts.chain)
            done("agents_stopped")
        summary = _summarize(cluster, job["id"], opts.nodes)
        done("summary")
        if opts.chain:
            from marketplace.demo.chain import settlement_figures, wait_settled

            print("waiting for the last contributions' settlement batch on chain", file=out)
            wait_settled(job["id"])
            summary["chain"] = settlement_figures(job["id"])
        summary |= {"wall_s": round(time.monotonic() - started, 1), "model_path": str(model_path),
                    "url": cluster.url, "phases_s": phases}  # fmt: skip
        if opts.serve:
            _serve(cluster, people, summary, out)
        return summary
    finally:
        cluster.close()
        chain.close()


def _start_chain(stack: contextlib.ExitStack, root: Path, out: Any) -> dict[str, str]:
    """A Hardhat node with the contracts deployed, stopped when the demo ends."""
    from contracts.hardhat_node import hardhat_chain, missing_reason
    from marketplace.demo.chain import chain_env

    if (reason := missing_reason()) is not None:
        raise SystemExit(f"gpuflex demo --chain: {reason}")
    workdir = root / "hardhat"
    workdir.mkdir()
    node = stack.enter_context(hardhat_chain(workdir))
    print(f"hardhat node at {node.url}; contracts deployed", file=out)
    return chain_env(node)


def _wait_for_agents(url: str, provider_key: str, count: int, timeout_s: float) -> int:
    """Submit once the agents are online (registered, benchmarked, heartbeating), as the
    simulator's nodes are at time 0: round 1 then times training, not agent start-up, and
    its plan covers every node. After `timeout_s` the demo goes on with those that are.
    Asked of the API, as their provider sees them: the demo holds no Django meanwhile."""
    from marketplace.client import Client

    end = time.monotonic() + timeout_s
    with Client(url, provider_key) as client:
        while True:
            online = sum(
                node["state"] != "offline" and node["last_heartbeat_at"] is not None
                for node in client.nodes()
            )
            if online >= count or time.monotonic() >= end:
                return online
            time.sleep(0.25)


def _summarize(cluster: Cluster, job_id: str, plans: tuple[NodePlan, ...]) -> dict[str, Any]:
    """The job's summary from the database, read in this process once the cluster's
    training is over (Django set up only now: marketplace/demo/setup.py)."""
    os.environ.update(cluster.env())
    import django

    django.setup()
    from marketplace.demo.summary import summarize

    return summarize(job_id, {p.name: asdict(p) for p in plans})


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _serve(cluster: Cluster, people: dict[str, Any], summary: dict[str, Any], out: Any) -> None:
    from marketplace.demo.accounts import PASSWORD
    from marketplace.demo.summary import print_summary

    print_summary(summary, lambda line: print(line, file=out))
    for line in serve_lines(cluster.url, list(people.values()), PASSWORD):
        print(line, file=out)
    print("Ctrl-C stops it.", file=out, flush=True)
    try:
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


def serve_lines(url: str, people: list[Any], password: str) -> list[str]:
    """What `demo --serve` says once the job is done: where the marketplace is, the logins,
    and how to point the `gpuflex` CLI at it as the buyer."""
    lines = [f"\nthe marketplace stays up at {url}/ (API: {url}/api/v1/docs/)"]
    for login in people:
        lines.append(f"  log in as {login.username:9} password {password}  ({login.role}; "
                     f"API key {login.key})")  # fmt: skip
    buyer = next((p for p in people if p.role == "buyer"), None)
    if buyer is not None:
        lines += [
            "point the gpuflex CLI at it, as the buyer (another terminal):",
            f"  export GPUFLEX_SERVER={url} GPUFLEX_API_KEY={buyer.key}",
            "  gpuflex jobs      # or: gpuflex --server URL --key KEY jobs",
        ]
    return lines


def main(args: Any) -> int:
    opts = Options(
        data_dir=Path(args.data_dir), port=args.port, target=args.target, budget=args.budget,
        timeout_s=args.timeout, serve=args.serve, quiet=args.json, chain=args.chain,
    )  # fmt: skip
    summary = run(opts)
    from marketplace.demo.summary import print_summary

    if args.json:
        print(json.dumps(summary))
    elif not args.serve:
        print_summary(summary)
    ok = summary["status"] == "completed" and summary["reached_target"]
    if "chain" in summary:
        from marketplace.demo.chain import print_figures

        if not args.json:
            print_figures(summary["chain"])
        ok = ok and summary["chain"]["every_contribution_on_chain"]
    return 0 if ok and summary["ledger_balanced"] and summary["provenance_verified"] else 1
