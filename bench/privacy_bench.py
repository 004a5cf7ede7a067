"""What differential privacy costs in accuracy (`python -m bench.run --only privacy`).

The digits MLP trained by FedAvg in the simulator over 8 nodes for a fixed number of rounds:
without privacy, with the whole update clipped (no noise: the clip's own cost), and with
update-level DP at ε = 8 and ε = 2 (δ = 1e-5), the noise computed by Opacus's accountant for
those rounds (trainer/privacy.py). Each node noises its own update (the server sees each
one), so the average's noise falls as one over the square root of the node count: the
figures say what that honest placement costs. A row for sample-level DP-SGD (Opacus) at
ε = 8 shows the other mode. The secure-aggregation row runs every round's updates through the
protocol (trainer/secagg, in process): the server aggregates the unmasked mean only. Its
cost per round, against a plain round, is bench/secagg_bench.py's table.
"""

from __future__ import annotations

from typing import Any

ROUNDS = 10
NODES = 8
CLIP = 1.0
SPEC: dict[str, Any] = {
    "name": "digits-private",
    "seed": 0,
    "dataset": {"kind": "digits", "test_fraction": 0.2},
    "model": {"arch": "mlp", "hidden": [128]},
    "optimizer": {"name": "sgd", "lr": 0.2},
    "local": {"steps": 10, "batch_size": 32},
    "rounds": {"max_rounds": ROUNDS},
    "aggregation": {"strategy": "fedavg"},
    "sharding": {"method": "stratified"},
}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("no privacy", {}),
    ("clip only", {"clip_norm": CLIP}),
    ("update DP, ε = 8", {"clip_norm": CLIP, "epsilon": 8.0, "delta": 1e-5}),
    ("update DP, ε = 2", {"clip_norm": CLIP, "epsilon": 2.0, "delta": 1e-5}),
    ("sample DP-SGD, ε = 8", {"clip_norm": CLIP, "epsilon": 8.0, "delta": 1e-5, "mode": "sample"}),
    ("secure aggregation", {"secure_aggregation": {"enabled": True}}),
]


def run() -> dict[str, Any]:
    from trainer.sim.federated import RunOptions, run_federated
    from trainer.sim.setup import prepare
    from trainer.spec import parse_spec

    rows = []
    for label, privacy in CASES:
        spec = parse_spec(SPEC | {"privacy": privacy})
        setup = prepare(spec, NODES, "lan", seed=0)
        result, _ = run_federated(setup, RunOptions(stop_at_target=False))
        rows.append({
            "case": label,
            "noise_multiplier": setup.spec.privacy.noise_multiplier,
            "rounds": result.rounds,
            "accuracy": round(result.final_accuracy, 4),
            "epsilon_spent": (round(result.epsilon_spent, 3)
                              if result.epsilon_spent is not None else None),
        })  # fmt: skip
    from bench.secagg_bench import run_scaling

    return {"rounds": ROUNDS, "nodes": NODES, "clip_norm": CLIP, "rows": rows,
            "secagg": run_scaling()}  # fmt: skip


def render(data: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## Privacy: digits MLP, FedAvg, {data['nodes']} simulated nodes, "
        f"{data['rounds']} rounds, clip {data['clip_norm']:g}",
        "",
        "| case | noise multiplier | rounds | accuracy | ε spent (δ = 1e-5) |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        eps = "—" if r["epsilon_spent"] is None else f"{r['epsilon_spent']:.2f}"
        lines.append(
            f"| {r['case']} | {r['noise_multiplier']:.3g} | {r['rounds']} | "
            f"{r['accuracy']:.3f} | {eps} |"
        )
    if "secagg" in data:
        from bench.secagg_bench import render_scaling

        lines += render_scaling(data["secagg"])
    return lines


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
