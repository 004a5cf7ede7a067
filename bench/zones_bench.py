"""Flat uploads against zone pre-aggregation in the simulator (`--only zones`).

3 zones x 8 nodes on the wan profile, digits MLP (examples/digits-mlp.yaml) to 0.95 accuracy:
bytes into the coordinator per round and time to the target, with the coordinator's ingress
unlimited (what the rest of the simulator assumes) and capped at 10 Mbit/s. Both runs
aggregate the same updates (trainer.zones keeps FedAvg exact), so they take the same rounds;
the figure that changes is the coordinator's ingress, and with it the time when that link
is the bottleneck. `max_param_diff` is the largest difference between the two final models.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.setup import prepare
from trainer.spec import load_spec

MLP = Path(__file__).resolve().parent.parent / "examples" / "digits-mlp.yaml"


def _row(result: Any) -> dict[str, Any]:
    log = result.log
    return {
        "time_to_target_s": result.time_to_target_s,
        "rounds": len(log),
        "final_accuracy": log[-1].accuracy,
        "bytes_in_per_round": statistics.median(r.bytes_in for r in log),
        "bytes_up_per_round": statistics.median(r.bytes_up for r in log),
        "median_round_s": statistics.median(r.round_s for r in log),
    }


def run(zones: int = 3, per_zone: int = 8, network: str = "wan") -> dict[str, Any]:
    spec = load_spec(MLP)
    nodes = zones * per_zone
    out: dict[str, Any] = {"zones": zones, "nodes": nodes, "network": network, "runs": {}}
    for ingress in (None, 10.0):
        finals = {}
        for mode, z in (("flat", 0), ("zones", zones)):
            setup = prepare(spec, nodes, network, spec.seed)
            options = RunOptions(zones=z, coordinator_in_mbps=ingress)
            result, state = run_federated(setup, options, method=mode)
            finals[mode] = state
            key = f"{mode}_ingress_{'unlimited' if ingress is None else f'{ingress:g}mbps'}"
            out["runs"][key] = row = _row(result)
            print(
                f"  {key:28} t95={row['time_to_target_s']} rounds={row['rounds']} "
                f"in/round={row['bytes_in_per_round'] / 1e3:.0f} KB "
                f"round={row['median_round_s']:.2f} s"
            )
        diff = max(
            float((finals["flat"][k] - finals["zones"][k]).abs().max()) for k in finals["flat"]
        )
        out["runs"][f"max_param_diff_ingress_{ingress}"] = diff
    flat, hier = out["runs"]["flat_ingress_unlimited"], out["runs"]["zones_ingress_unlimited"]
    out["bytes_in_ratio"] = flat["bytes_in_per_round"] / hier["bytes_in_per_round"]
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
