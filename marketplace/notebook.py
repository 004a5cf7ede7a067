"""Training a buyer's own PyTorch model from a notebook: `Client.fit` (marketplace/client.py).

One call takes a module, a loss, example inputs and a dataset; on the buyer's machine it
exports the module with its loss as a torch.export program (trainer/exported/export.py),
writes the dataset as a file the marketplace accepts, submits the job with both, follows it
with a progress bar, and loads the trained weights back into the module. No code of the
buyer's runs on a node: nodes execute the program's ATen operators only.

    from marketplace.client import Client
    with Client(url, api_key) as client:
        result = client.fit(net, F.cross_entropy, (x[:8], y[:8]), (x, y), budget="5")
    result.model  # `net`, trained

Results are dataclasses (FitResult, RoundResult). Needs torch (the buyer's own install);
the rest of the SDK does not.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import torch
    from torch import nn

# marketplace.client.Client, which calls fit() from its own fit(): named, not imported (an
# import either way would be a circle)
Client = Any

# a dataset given as tensors or arrays: (inputs, targets); a path: a Parquet file (with a
# "label" column) or an image folder (a subfolder per class); "digits": the built-in set
DatasetArg = Any
PROGRAM = "program.pt2"


@dataclass(frozen=True)
class RoundResult:
    number: int
    loss: float | None
    accuracy: float | None


@dataclass(frozen=True)
class FitResult:
    """What `Client.fit` returns: the module trained, and the job that trained it."""

    model: nn.Module
    job_id: str
    status: str
    rounds: list[RoundResult] = field(default_factory=list)

    @property
    def accuracy(self) -> float | None:
        return self.rounds[-1].accuracy if self.rounds else None

    @property
    def loss(self) -> float | None:
        return self.rounds[-1].loss if self.rounds else None


class FitFailed(RuntimeError):
    """The job ended without completing (failed, cancelled, stopped); says why."""

    def __init__(self, job_id: str, status: str, error: str) -> None:
        self.job_id, self.status, self.error = job_id, status, error
        super().__init__(f"job {job_id} {status}" + (f": {error}" if error else ""))


def dataset_section(dataset: DatasetArg, folder: Path) -> dict[str, Any]:
    """The spec's dataset section for `dataset`, with (inputs, targets) written to an .npz
    file in `folder` (the file the submission uploads beside the spec)."""
    import numpy as np

    if isinstance(dataset, str) and dataset == "digits":
        return {"kind": "digits"}
    if isinstance(dataset, (str, Path)):
        path = Path(dataset).expanduser().resolve()
        if path.is_dir():  # an image folder goes up as a zip of it (trainer/datasets/images)
            import shutil

            archive = shutil.make_archive(str(folder / "images"), "zip", root_dir=path)
            return {"kind": "image_folder", "path": Path(archive).name}
        if path.name.endswith((".zip", ".tar", ".tar.gz", ".tgz")):
            return {"kind": "image_folder", "path": str(path)}
        if path.suffix == ".parquet":
            return {"kind": "parquet", "path": str(path)}
        if path.suffix == ".npz":
            return {"kind": "npz", "path": str(path)}
        raise ValueError(f"dataset: {path} is not a folder, a .parquet or an .npz file")
    if not (isinstance(dataset, (tuple, list)) and len(dataset) == 2):
        raise ValueError("dataset: (inputs, targets) as tensors or arrays, a path, or 'digits'")
    x, y = (_array(part) for part in dataset)
    if len(x) != len(y):
        raise ValueError(f"dataset: {len(x)} inputs but {len(y)} targets")
    path = folder / "dataset.npz"
    np.savez(path, x=x, y=y)
    return {"kind": "npz", "path": path.name}


def _array(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach"):  # a tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def fit_spec(name: str, dataset: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The job spec: the exported program and the dataset, then the buyer's own sections
    (docs/job-spec.md) over the defaults."""
    spec: dict[str, Any] = {
        "name": name,
        "dataset": dataset,
        "model": {"arch": "exported", "program": PROGRAM},
        "optimizer": {"name": "adam", "lr": 0.001},
        "local": {"epochs": 1, "batch_size": 32},
        "rounds": {"max_rounds": 10},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            base = dict(spec[key])
            if key == "local" and ("steps" in value or "epochs" in value):
                base.pop("epochs", None)  # one of the two: the buyer's
            spec[key] = {**base, **value}
        else:
            spec[key] = value
    spec["model"] = {"arch": "exported", "program": PROGRAM}  # the program is this call's
    return spec


def fit(
    client: Client,
    module: nn.Module,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    example_inputs: tuple[torch.Tensor, torch.Tensor],
    dataset: DatasetArg,
    *,
    budget: str,
    name: str = "notebook-fit",
    tier: str = "hybrid",
    spec: dict[str, Any] | None = None,
    logits: bool = True,
    progress: bool = True,
    interval: float = 2.0,
) -> FitResult:
    """Export, upload, submit, follow, and load the trained weights into `module`."""
    from trainer.exported.export import export_program

    with tempfile.TemporaryDirectory(prefix="gpuflex-fit-") as tmp:
        folder = Path(tmp)
        export_program(module, loss, example_inputs, folder / PROGRAM, logits=logits)
        data = dataset_section(dataset, folder)
        job_file = folder / "job.yaml"
        job_file.write_text(yaml.safe_dump(fit_spec(name, data, spec or {})), "utf-8")
        job = client.submit(job_file, budget=budget, tier=tier)
    state = _follow(client, job, interval, progress)
    job_id = str(job["id"])
    if state["status"] != "completed":
        raise FitFailed(job_id, state["status"], str(state.get("error") or ""))
    _load_trained(module, client.model_bytes(job_id, "safetensors"))
    rounds = [
        RoundResult(int(r["number"]), (r.get("metrics") or {}).get("loss"),
                    (r.get("metrics") or {}).get("accuracy"))
        for r in client.rounds(job_id) if r.get("metrics")
    ]  # fmt: skip
    return FitResult(model=module, job_id=job_id, status=state["status"], rounds=rounds)


def _follow(client: Client, job: dict[str, Any], interval: float, progress: bool) -> dict:
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=job.get("max_rounds"), desc=job.get("name"), unit="round")
    state = job
    try:
        for state in client.follow(job["id"], interval):
            if bar is not None:
                bar.update(state["rounds_done"] - bar.n)
                metrics = state.get("last_metrics") or {}
                shown = {k: f"{metrics[k]:.3f}" for k in ("accuracy", "loss") if k in metrics}
                bar.set_postfix(status=state["status"], **shown)
    finally:
        if bar is not None:
            bar.close()
    return state


def _load_trained(module: nn.Module, weights: bytes) -> None:
    """The job's final weights (named as the program names them: the module's under
    `model.`, trainer/exported/export.py) into `module`."""
    from safetensors.torch import load

    state = {k.removeprefix("model."): v for k, v in load(weights).items()}
    module.load_state_dict(state)  # counters (float32 on the nodes) cast back by copy_
