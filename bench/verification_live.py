"""What verification costs in steady state, measured through the real system: `gpuflex serve`'s
web process, its Celery worker and real `gpuflex-node` agents (issue 35: 20 nodes, 5 %
cheaters).

Steady state: every node has earned its trust already (GPUFLEX_TRUST_AFTER_VERIFIED=0), so its
uploads are checked at the trusted rate; the one cheater (`half_steps`, fault injection) goes on
probation once caught and has every later upload checked. The verification compute is what the
server itself recorded: the steps its worker re-ran for segment checks and the steps of replica
tasks, against the steps of the primary tasks (the useful work).

    python -m bench.verification_live [--nodes 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from marketplace.demo.cluster import NodePlan
from tests.system.harness import System, manage, wait_for

PRICE = "2.00"
_FIGURES = (
    "import json; from django.db.models import Sum; "
    "from marketplace.proofs.models import SegmentCheck as C; "
    "from marketplace.rounds.models import Task; "
    "done = Task.objects.filter(status='done'); "
    "checks = C.objects.filter(status__in=('passed', 'failed')); "
    "print(json.dumps({"
    "'primary_steps': done.filter(replica=0).aggregate(s=Sum('steps'))['s'] or 0, "
    "'primary_tasks': done.filter(replica=0).count(), "
    "'replica_steps': done.filter(replica__gt=0).aggregate(s=Sum('steps'))['s'] or 0, "
    "'replica_tasks': done.filter(replica__gt=0).count(), "
    "'rerun_steps': checks.aggregate(s=Sum('rerun_steps'))['s'] or 0, "
    "'checks': checks.count(), "
    "'pending_checks': C.objects.exclude(status__in=('passed', 'failed', 'skipped')).count(), "
    "'by_node': {n.name: [n.verified_ok, n.verified_bad, "
    "C.objects.filter(node=n, status='failed').count(), "
    "C.objects.filter(node=n, status='passed').count(), "
    "done.filter(replica=0, node=n).count()] "
    "for n in __import__('marketplace.nodes.models', fromlist=['Node']).Node.objects.all()}}))"
)


def run(nodes: int = 20, rounds: int = 5, cheaters: int = 1) -> dict[str, Any]:
    plans = tuple(
        NodePlan(f"n{i:02d}", kind="volunteer", price=PRICE,
                 byzantine="half_steps" if i < cheaters else "")
        for i in range(nodes)
    )  # fmt: skip
    env = {
        "GPUFLEX_TRUST_AFTER_VERIFIED": "0",  # steady state: every node trusted already
        "GPUFLEX_SEGMENT_CHECK_SHARE": os.environ.get("BENCH_CHECK_SHARE", "0.25"),
        "GPUFLEX_WARM_TASKS": "0",  # 20 warm workers would not fit beside each other here
    }
    spec = {
        "name": "verification-overhead", "seed": 0,
        "dataset": {"kind": "digits", "test_fraction": 0.2},
        "model": {"arch": "mlp", "hidden": [64]},
        "optimizer": {"name": "sgd", "lr": 0.2},
        "local": {"steps": 16, "batch_size": 32},
        # every shard settles: each node, the cheater too, does its task each round
        "rounds": {"max_rounds": rounds, "deadline_s": 300, "quorum": 1.0},
        "sharding": {"method": "stratified", "num_shards": nodes},
    }  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuflex-verify-") as tmp:
        system = System(Path(tmp), plans, **env)  # the fault tests' harness: real processes
        try:
            manage(system.cluster, "grant_credit", "buyer", "500")
            system.start()
            with system.client() as client:
                job = client.submit(spec, budget="400", tier="volunteer",
                                    max_price_per_gpu_hour="50")  # fmt: skip
            done = system.wait_done(str(job["id"]), timeout=60 * 30)

            def settled() -> dict[str, Any] | None:
                out = manage(system.cluster, "shell", "-c", _FIGURES)
                f = json.loads(out.strip().splitlines()[-1])
                return f if f["pending_checks"] == 0 else None

            figures = wait_for(settled, 600, "the segment checks to settle", every=3.0)
        finally:
            system.close()
    useful = figures["primary_steps"]
    verification = figures["rerun_steps"] + figures["replica_steps"]
    return {
        "nodes": nodes, "cheaters": cheaters, "rounds": rounds, "job_status": done["status"],
        "check_share": float(env["GPUFLEX_SEGMENT_CHECK_SHARE"]),
        "overhead": round(verification / useful, 4) if useful else None,
        "wall_s": round(time.monotonic() - started, 1), **figures,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.nodes, args.rounds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
