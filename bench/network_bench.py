"""Network-aware training against naive sync and plain FedAvg (issue figures), plus the chart."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trainer.sim.compare import compare, network_aware_variant, run_method, summary
from trainer.sim.setup import prepare
from trainer.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "digits-mlp.yaml"
CNN = ROOT / "examples" / "digits-cnn.yaml"


def comparison(spec_path: Path, nodes: int = 8, network: str = "wan") -> dict[str, Any]:
    spec = load_spec(spec_path)
    data = summary(compare(spec, nodes, network, spec.seed, target=0.95))
    data["model"] = spec.model.arch
    data["nodes"], data["network"] = nodes, network
    for method in ("naive_sync", "fedavg", "network_aware"):
        row = data[method]
        print(
            f"  {spec.model.arch} {network} {method:14} t95={row['time_to_target_s']} "
            f"rounds={row['rounds_to_target']} util={row['utilization']:.3f}"
        )
    return data


def hetero_idle(nodes: int = 8) -> dict[str, Any]:
    """Idle time waiting for the slowest node, with a 4x compute spread."""
    spec = load_spec(MLP)
    plain = run_method("fedavg", spec, nodes, "hetero", spec.seed)
    aware = run_method("network_aware", spec, nodes, "hetero", spec.seed)
    out = {
        "equal_work_idle_fraction": plain.idle_fraction,
        "network_aware_idle_fraction": aware.idle_fraction,
        "network_aware_time_to_target_s": aware.time_to_target_s,
        "equal_work_time_to_target_s": plain.time_to_target_s,
    }
    print(f"  hetero idle: equal work {plain.idle_fraction:.3f}, aware {aware.idle_fraction:.3f}")
    return out


def flaky_slowdown(nodes: int = 8, seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> dict[str, Any]:
    """Network-aware on flaky (wan plus 20 % of nodes dropping per round) against the same
    nodes on wan. Runs reach the target in a handful of rounds, so one round more or less
    moves a single seed's ratio a lot: the figure is the median over several seeds."""
    spec = load_spec(MLP)
    per_seed = []
    for seed in seeds:
        steady = run_method("network_aware", spec, nodes, "wan", seed)
        flaky = run_method("network_aware", spec, nodes, "flaky", seed)
        per_seed.append(
            {
                "seed": seed,
                "wan_time_to_target_s": steady.time_to_target_s,
                "flaky_time_to_target_s": flaky.time_to_target_s,
                "flaky_reached_target": flaky.reached_target,
                "slowdown": (flaky.time_to_target_s or float("inf")) / steady.time_to_target_s,
                "node_rounds_dropped": sum(log.dropped for log in flaky.log),
                "node_rounds": nodes * flaky.rounds,
            }
        )
        print(f"  flaky seed {seed}: {per_seed[-1]['slowdown']:.2f}x the time of wan")
    slowdowns = [row["slowdown"] for row in per_seed]
    return {
        "median_slowdown": statistics.median(slowdowns),
        "all_reached_target": all(row["flaky_reached_target"] for row in per_seed),
        "node_rounds_dropped": sum(row["node_rounds_dropped"] for row in per_seed),
        "node_rounds": sum(row["node_rounds"] for row in per_seed),
        "per_seed": per_seed,
    }


def chart(data: dict[str, Any], path: Path) -> None:
    """Accuracy against simulated wall time for the three methods (log time axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    labels = {
        "naive_sync": "naive sync (all-reduce every step)",
        "fedavg": "plain FedAvg",
        "network_aware": "GPUFlex network-aware",
    }
    for method, label in labels.items():
        row = data[method]
        ax.plot(row["sim_time_per_round"], row["accuracy_per_round"], marker=".", label=label)
    ax.axhline(0.95, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("simulated wall-clock time (s, log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"digits {data['model'].upper()}, {data['nodes']} nodes, {data['network']}")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def policy_plan_example() -> dict[str, Any]:
    """What the policy decided for each wan node in round 1 (codec, steps), for the record."""
    from trainer.adapt import plan_round
    from trainer.sim.adaptive import NetworkAwareRun

    spec = network_aware_variant(load_spec(MLP))
    run = NetworkAwareRun(prepare(spec, 8, "wan", spec.seed))
    plan, _ = plan_round(spec, run.numel, [n.measurement(run.step_s[n.node_id]) for n in run.nodes])
    return {
        nid: {"codec": p.codec, "steps": p.steps, "batch": p.batch_size, "sync_every": p.sync_every}
        for nid, p in plan.nodes.items()
    }
