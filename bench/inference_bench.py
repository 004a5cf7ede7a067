"""Inference through the marketplace against one process running the same model on the same
rows (`python -m bench.run --only inference`).

The marketplace side is `gpuflex demo`'s machinery: the server (granian), a Celery worker and
five real agents (platform nodes on the lan profile, sandboxed runners, warm workers), each a
process of its own. A buyer submits a `kind: inference` job with an uploaded checkpoint and an
npz of ROWS rows; the clock runs from the accepted submission (upload and checks done) to the
job's completion, and the predictions are downloaded and checked against the single process's
(same rows, same order, same classes). The single process is trainer.scoring.predict over
every row in this process, best of three. The ratio is marketplace rows/s over single-process
rows/s, both measured here in the same run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 60_000
FEATURES = 64
CLASSES = 10
HIDDEN = [256, 256]
TASKS = 20
AGENTS = 5
TIMEOUT_S = 900.0


def _data(path: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    y = (x @ rng.standard_normal((FEATURES, CLASSES))).argmax(1).astype(np.int64)
    np.savez(path, x=x, y=y)
    return x


def _model() -> Any:
    from trainer.models import build_model
    from trainer.spec import ModelSpec

    return build_model(ModelSpec(arch="mlp", hidden=HIDDEN), (FEATURES,), CLASSES, seed=1)


def single_process(x: np.ndarray) -> tuple[float, Any]:
    """Rows per second of one process predicting every row (best of three), and its answer."""
    import torch

    from trainer.scoring import predict

    model, rows = _model(), torch.from_numpy(x)
    best, out = float("inf"), None
    for _ in range(3):
        started = time.perf_counter()
        out = predict(model, rows)
        best = min(best, time.perf_counter() - started)
    return ROWS / best, out


def marketplace(tmp: Path, data: Path, checkpoint: Path) -> dict[str, Any]:
    from marketplace.demo.cluster import Cluster, NodePlan
    from marketplace.demo.run import AGENTS_READY_S, _benchmark, _setup, _wait_for_agents

    os.environ.setdefault("GPUFLEX_WARM_TASKS", "1")
    nodes = [NodePlan(f"platform-{i}", kind="platform", profile="lan", price="3.00")
             for i in range(AGENTS)]  # fmt: skip
    (tmp / "cluster").mkdir()
    cluster = Cluster(tmp / "cluster")
    try:
        cluster.extra_env["GPUFLEX_REFERENCE_FP32_TFLOPS"] = f"{_benchmark(cluster):.6g}"
        people = _setup(cluster, nodes)
        from marketplace.client import Client

        cluster.start_web()
        cluster.start_worker()
        for plan in nodes:
            cluster.configure_agent(plan, people["provider"].key)
            cluster.start_agent(plan)
        online = _wait_for_agents(cluster.url, people["provider"].key, len(nodes), AGENTS_READY_S)
        spec = {"name": "inference-bench", "kind": "inference",
                "dataset": {"kind": "npz", "path": data.name},
                "model": {"arch": "mlp", "hidden": HIDDEN, "checkpoint": checkpoint.name},
                "sharding": {"num_shards": TASKS}}  # fmt: skip
        with Client(cluster.url, people["buyer"].key, timeout=600) as client:
            t0 = time.monotonic()
            job = client.submit(spec, dataset=data, checkpoint=checkpoint, budget="20.00",
                                tier="platform", max_price_per_gpu_hour="5.00")  # fmt: skip
            accepted = time.monotonic()
            while job["status"] in ("running", "paused"):
                if time.monotonic() - accepted > TIMEOUT_S:
                    raise TimeoutError(f"the job was still {job['status']} after {TIMEOUT_S} s")
                time.sleep(0.2)
                job = client.job(job["id"])
            done = time.monotonic()
            if job["status"] != "completed":
                raise RuntimeError(f"the job ended {job['status']}: {job.get('error')}")
            parquet = client.predictions(job["id"], tmp / "predictions.parquet")
        return {"online": online, "submit_s": accepted - t0, "job_s": done - accepted,
                "parquet": str(parquet), "rows": job["result"]["rows"]}  # fmt: skip
    finally:
        cluster.close()


def run() -> dict[str, Any]:
    import pyarrow.parquet as pq
    import safetensors.torch
    import torch

    with tempfile.TemporaryDirectory(prefix="gpuflex-inference-bench-") as name:
        tmp = Path(name)
        data, checkpoint = tmp / "rows.npz", tmp / "model.safetensors"
        x = _data(data)
        checkpoint.write_bytes(safetensors.torch.save(_model().state_dict()))
        base_rps, expected = single_process(x)
        m = marketplace(tmp, data, checkpoint)
        table = pq.read_table(io.BytesIO(Path(m["parquet"]).read_bytes()))
        rows_ok = table.column("row").to_pylist() == list(range(ROWS))
        got = torch.tensor(table.column("prediction").to_pylist())
        agree = float((got == expected.labels).double().mean())
    rps = ROWS / m["job_s"]
    return {
        "rows": ROWS, "features": FEATURES, "classes": CLASSES, "hidden": HIDDEN,
        "tasks": TASKS, "agents": AGENTS, "agents_online": m["online"],
        "single_process_rows_per_s": base_rps, "single_process_threads": torch.get_num_threads(),
        "marketplace_rows_per_s": rps, "marketplace_job_s": m["job_s"],
        "submit_s": m["submit_s"], "ratio": rps / base_rps,
        "rows_in_order": rows_ok, "prediction_agreement": agree,
        "cpus": os.cpu_count(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="bench.inference_bench").parse_args(argv)
    import torch

    torch.set_num_threads(1)  # as bench.run does for its in-process baselines
    result = run()
    print(json.dumps(result), file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
