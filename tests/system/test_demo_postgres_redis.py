"""The `gpuflex demo` scenario against PostgreSQL and Redis: five agent processes, a worker
and a web server train the digits job to 0.95 and settle its money."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("system")]


def test_demo_on_postgres_and_redis(services, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CELERY_TASK_ALWAYS_EAGER"} | services
    out = subprocess.run(
        [sys.executable, "-m", "marketplace.cli", "demo", "--json",
         "--data-dir", str(tmp_path / "demo")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.stdout.strip(), out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, (summary, out.stderr[-3000:])
    assert summary["status"] == "completed" and summary["final_accuracy"] >= 0.95
    assert summary["ledger_balanced"] and summary["provenance_verified"]
    assert summary["updates_counted_twice"] == 0 and summary["tasks_still_leased"] == 0
    assert len(summary["nodes"]) == 5 and summary["verified_contributions"] > 0
    # every task recorded where it trained: here the CPU in fp32 (`auto`), on a GPU cuda
    expected = "cuda bf16" if torch.cuda.is_available() else "cpu fp32"
    assert {p for n in summary["nodes"] for p in n["ran_on"]} == {expected}
    budget, cost, refund = (
        float(summary[k]) for k in ("buyer_budget", "buyer_cost", "buyer_refund")
    )
    assert abs(budget - cost - refund) < 1e-9
    fee, earned = float(summary["platform_fee"]), float(summary["provider_earnings_total"])
    assert abs(cost - fee - earned) < 1e-9 and cost > 0
    assert os.path.getsize(summary["model_path"]) > 0
    # the goal (< 5 s from the upload received to the first lease), reported, never asserted
    to_lease = summary["submit_to_first_lease_s"]
    print(f"submit_to_first_lease_s: {to_lease}")
    assert to_lease is not None and to_lease >= 0
