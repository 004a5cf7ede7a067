"""Following the demo's job: a progress bar toward the target and a line per round."""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from marketplace.client import TERMINAL, Client


def follow(client: Client, job: dict[str, Any], timeout_s: float, out: Any) -> dict[str, Any]:
    target = float(job["spec"]["rounds"]["target"]["value"])
    bar = tqdm(total=round(target * 1000), desc="accuracy", unit="‰", file=out,
               bar_format="{desc} {bar} {n}/{total}‰ [{elapsed}]")  # fmt: skip
    seen = 0
    nodes_said = None
    end = time.monotonic() + timeout_s
    try:
        while True:
            job = client.job(job["id"])
            nodes_said = say_node_states(job, nodes_said, lambda line: tqdm.write(line, file=out))
            if job["rounds_done"] > seen:
                for r in client.rounds(job["id"]):
                    if r["status"] != "done" or r["number"] <= seen:
                        continue
                    m = r["metrics"]
                    tqdm.write(
                        f"round {r['number']:>2}: accuracy {m['accuracy']:.3f}  loss "
                        f"{m['loss']:.3f}  {m['participants']} updates"
                        + (f", {m['rejected']} rejected" if m.get("rejected") else ""),
                        file=out,
                    )
                    bar.n = min(round(m["accuracy"] * 1000), bar.total)
                    bar.refresh()
                seen = job["rounds_done"]
            if job["status"] in TERMINAL:
                if job["status"] != "completed" and job.get("error"):
                    tqdm.write(f"the job {job['status']}: {job['error']}", file=out)
                return job
            if time.monotonic() > end:
                tqdm.write(f"giving up after {timeout_s:.0f} s; cancelling the job", file=out)
                return client.cancel(job["id"])
            time.sleep(0.5)
    finally:
        bar.close()


def say_node_states(job: dict[str, Any], said: Any, write: Any) -> Any:
    """A line whenever the nodes that could work on the job change who waits and why (not on
    every working/idle flip between tasks); returns what was said, for the next call."""
    states = job.get("node_states")
    if not states:
        return said
    now = (states["nodes"], [(r["state"], r["reason"], r["nodes"]) for r in states["reasons"]])
    if now != said and (states["reasons"] or said is not None or not states["nodes"]):
        write(f"nodes: {states['summary']}")
    return now
