"""The marketplace's side of trainer/isolated.py: a buyer's tokenizer.json and Hugging Face
config run in a child process under the deployment's limits, and what goes wrong there comes
back as the same InvalidDataset / InvalidSpec / TooLarge a submission raises, to fail the job
with (its `error`, shown by the API and the job's page). Called by the worker that prepares a
job (jobs/preparation.py) and evaluates it (jobs/datasets.py), never in a web request.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from marketplace.jobs.errors import InvalidDataset, InvalidSpec, TooLarge
from trainer.fit import Footprint
from trainer.isolated import IsolatedError, Limits, read_dataset, read_model, run_step
from trainer.spec import DatasetSpec, ModelSpec

if TYPE_CHECKING:
    from trainer.datasets import Dataset

_CRASHES = ("crash", "memory", "time")


def limits(model_bytes: int = 0) -> Limits:
    """GPUFLEX["ISOLATED_MEMORY_MB"] for the interpreter, its libraries and the data, and
    three times a model's bytes besides when it is built (the weights, their copy, the file)."""
    g = settings.GPUFLEX
    return Limits(
        memory_bytes=int(g["ISOLATED_MEMORY_MB"]) * 2**20 + 3 * model_bytes,
        seconds=float(g["ISOLATED_SECONDS"]),
    )


def _named(text: str, folder: Path, names: dict[str, str]) -> str:
    # messages name the worker's temporary paths; the buyer knows the files by their names
    for path, shown in names.items():
        text = text.replace(path, shown).replace(Path(path).name, shown)
    return text.replace(str(folder), "")


def load_dataset(spec: DatasetSpec, seed: int, shown: str) -> Dataset:
    """The dataset `spec` names (paths on this machine), read with its tokenizer in a child;
    `shown`: the buyer's name for the file, used in errors."""
    from marketplace.jobs.dataset_files import archive_limits

    names = {spec.path or "": shown, spec.tokenizer or "": "tokenizer.json"}
    request = {"dataset": spec.model_dump(mode="json"), "seed": seed,
               "archive_limits": vars(archive_limits())}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuflex-isolated-") as tmp:
        try:
            result = run_step("dataset", request, Path(tmp), limits())
        except IsolatedError as exc:
            reason = _named(exc.reason, Path(tmp), {k: v for k, v in names.items() if k})
            if exc.kind == "too_large":
                raise TooLarge(f"The dataset is refused: {reason}") from None
            if exc.kind in _CRASHES:
                what = "with its tokenizer.json" if spec.tokenizer else ""
                reason = f"reading {shown} {what}: {reason}".replace("  ", " ")
            raise InvalidDataset(f"The dataset cannot be used: {reason}") from None
        return read_dataset(Path(tmp), result)


def _model_request(
    spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int, checkpoint: Path | None
) -> dict:
    return {"model": spec.model_dump(mode="json"), "input_shape": list(input_shape),
            "num_classes": num_classes,
            "checkpoint": str(checkpoint) if checkpoint else None}  # fmt: skip


def _model_error(exc: IsolatedError, spec: ModelSpec, doing: str) -> InvalidSpec:
    field = "model.checkpoint" if "checkpoint" in exc.reason else "model.arch"
    if exc.kind in _CRASHES:
        field = "model.config" if spec.config is not None else "model.arch"
        reason = f"{doing} it: {exc.reason}"
    else:
        reason = exc.reason
    return InvalidSpec(
        f"The job spec is invalid: {field}: {reason}.",
        problems=[{"field": field, "reason": reason}],
    )


def measure(
    spec: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    lm: bool,
    checkpoint: Path | None,
) -> Footprint:
    """trainer.fit.measure_footprint on the meta device, in a child (the checkpoint checked
    by its header there too)."""
    request = _model_request(spec, input_shape, num_classes, checkpoint) | {"lm": lm}
    with tempfile.TemporaryDirectory(prefix="gpuflex-isolated-") as tmp:
        try:
            result = run_step("footprint", request, Path(tmp), limits())
        except IsolatedError as exc:
            raise _model_error(exc, spec, "measuring") from None
    return Footprint.from_dict(result["footprint"])


def build(
    spec: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    checkpoint: Path | None,
    model_bytes: int,
) -> dict:
    """The model's state dict, built with `seed` (and the checkpoint's weights) in a child."""
    request = _model_request(spec, input_shape, num_classes, checkpoint) | {"seed": seed}
    with tempfile.TemporaryDirectory(prefix="gpuflex-isolated-") as tmp:
        try:
            run_step("model", request, Path(tmp), limits(model_bytes))
        except IsolatedError as exc:
            raise _model_error(exc, spec, "building") from None
        return read_model(Path(tmp))
