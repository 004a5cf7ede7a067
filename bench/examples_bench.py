"""Loss curves of examples/stdlib-lm.yaml and examples/lora-finetune.yaml in the simulator.

Each example trains on its own files as `gpuflex examples write` makes them (the stdlib
corpus, a tiny GPT-2 of generated weights), with the spec's settings except the corpus size
and the round count, which are cut down so that the bench runs on a laptop CPU. The held-out
loss is measured before round 1 (the baseline) and after every round; the table reports each
as a ratio to that baseline, and the byte-level loss in nats (ln 256 = 5.55 is a uniform
guess over the byte values).

`python -m bench.run --only examples`, or alone: `python -m bench.examples_bench`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trainer.evaluate import evaluate
from trainer.example_files import write_examples
from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.setup import prepare
from trainer.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPECS = ("stdlib-lm.yaml", "lora-finetune.yaml")


def loss_curve(spec_file: str, folder: Path, nodes: int = 4, rounds: int = 8) -> dict[str, Any]:
    shutil.copy(EXAMPLES / spec_file, folder / spec_file)
    spec = load_spec(folder / spec_file)
    setup = prepare(spec, nodes, "lan", spec.seed, folder)
    before = evaluate(setup.model, setup.dataset)
    result, _ = run_federated(setup, RunOptions(max_rounds=rounds, stop_at_target=False))
    losses = [before.loss, *(r.loss for r in result.log)]
    return {
        "spec": spec_file,
        "nodes": nodes,
        "train_samples": setup.dataset.num_train,
        "test_samples": setup.dataset.num_test,
        "steps_per_round": spec.local.steps,
        "batch_size": spec.local.batch_size,
        "loss": losses,
        "loss_ratio": [loss / losses[0] for loss in losses],
        "accuracy": [before.accuracy, *(r.accuracy for r in result.log)],
        "bytes_up_per_round": result.bytes_up / max(result.rounds, 1),
        "host_compute_s": result.host_compute_s,
    }


def run(corpus_bytes: int = 256 * 1024, rounds: int = 6, nodes: int = 4) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuflex-examples-") as tmp:
        folder = Path(tmp)
        write_examples(folder, corpus_bytes)
        curves = {}
        for spec_file in SPECS:
            print(f"examples: {spec_file}, {rounds} rounds on {nodes} simulated nodes")
            curves[spec_file] = loss_curve(spec_file, folder, nodes, rounds)
    return {"corpus_bytes": corpus_bytes, "rounds": rounds, "curves": curves}


def table(data: dict[str, Any]) -> str:
    curves = data["curves"]
    rounds = len(next(iter(curves.values()))["loss"])
    head = "| round | " + " | ".join(f"{name} loss (ratio)" for name in curves) + " |"
    lines = [head, "|---:|" + "---:|" * len(curves)]
    for i in range(rounds):
        cells = [f"{c['loss'][i]:.3f} ({c['loss_ratio'][i]:.3f})" for c in curves.values()]
        lines.append(f"| {i if i else 'before'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(data: dict[str, Any]) -> list[str]:
    return [
        "## Example loss curves (stdlib corpus, simulator)",
        "",
        f"`examples/stdlib-lm.yaml` and `examples/lora-finetune.yaml` on "
        f"{data['corpus_bytes'] // 1024} KiB of the stdlib's source, 4 simulated lan nodes, "
        f"{data['rounds']} rounds; held-out loss in nats per byte and its ratio to the loss "
        "before round 1 (`python -m bench.run --only examples`).",
        "",
        table(data),
        "",
    ]


if __name__ == "__main__":
    result = run()
    print(json.dumps(result))
    print("\n".join(render(result)))
