"""A job's checks once its dataset is loaded: the model's size against the job's cap, the
federated silos, the shards' plans, the privacy noise. A submission runs them in its request
(jobs/submission.py); for a job whose files run through a native library (a tokenizer.json,
a Hugging Face config: needs_worker) the worker that prepares it runs them instead, measuring
the model in a child process (jobs/worker_checks.py). Errors name the spec's field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from marketplace.jobs.errors import InvalidSpec
from marketplace.jobs.limits import ModelCap
from marketplace.nodes.models import Node
from marketplace.rounds.lifecycle import quorum_units, schema_misfit
from trainer.fit import Footprint, estimate_memory, measure_footprint
from trainer.hf_limits import least_parameters
from trainer.spec import HF_ARCHS, JobSpec, ModelSpec

if TYPE_CHECKING:
    from marketplace.jobs import scoring
    from trainer.datasets import Dataset


def _problems(problems: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"field": field, "reason": reason} for field, reason in problems]


def spec_error(problems: list[tuple[str, str]]) -> InvalidSpec:
    sentence = "; ".join(f"{field}: {reason}" for field, reason in problems)
    return InvalidSpec(f"The job spec is invalid: {sentence}.", problems=_problems(problems))


def needs_worker(spec: JobSpec) -> bool:
    """A job whose checks run a buyer's file through a native library: a tokenizer.json
    (its regexes run in Rust) or a Hugging Face config (transformers builds it). Its request
    does bounded checks only; a worker reads and measures it in a child process
    (jobs/worker_checks.py) before building its model."""
    # an exported program's graph passed the request's gate (trainer/exported/gate.py); its
    # parameters and activations are measured by torch, in the worker
    return (
        spec.dataset.tokenizer is not None
        or spec.model.arch in HF_ARCHS
        or spec.model.arch == "exported"
    )


def check_hf_size(spec: JobSpec, cap: ModelCap, why: str) -> None:
    """An hf_* config whose numbers alone make it larger than the cap, refused by arithmetic
    (trainer/hf_limits.py; the spec already bounds each size field)."""
    if not isinstance(spec.model.config, dict):
        return
    least, sizes = least_parameters(spec.model.config)
    if least > cap.parameters:
        raise spec_error([("model.config", f"its {sizes} make at least {least:,} parameters; "
                            f"{why} allows at most {cap.parameters:,}")])  # fmt: skip


@dataclass(frozen=True)
class Checked:
    """What check_job found: the spec (its privacy noise settled), the dataset as the job
    uses it, its shards' plans, the model's footprint, the checkpoint to store (a scoring
    job's source model), and the memory a node needs."""

    spec: JobSpec
    dataset: Dataset
    plans: list
    footprint: Footprint
    checkpoint: Path | None
    min_memory_gb: float


# (model, input shape, classes, language model?, checkpoint) -> its footprint; InvalidSpec
Measure = Callable[[ModelSpec, tuple[int, ...], int, bool, "Path | None"], Footprint]


def measure_here(
    model: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    lm: bool,
    checkpoint: Path | None,
) -> Footprint:
    """Measured on the meta device, the checkpoint checked by its header: the weights are
    built by a worker (jobs/preparation.py), never in this request."""
    from trainer.models import ModelSpecError, meta_weights

    try:
        weights = meta_weights(checkpoint) if checkpoint else None
        return measure_footprint(model, input_shape, num_classes, lm, weights)
    except ModelSpecError as exc:
        field = "model.checkpoint" if "checkpoint" in str(exc) else "model.arch"
        if str(exc).startswith("model.program: "):  # an exported program (trainer/exported)
            field, exc = "model.program", str(exc).removeprefix("model.program: ")
        raise spec_error([(field, str(exc))]) from None


def check_job(
    spec: JobSpec,
    dataset: Dataset,
    checkpoint: Path | None,
    source: scoring.Source | None,
    *,
    cap: ModelCap,
    why: str,
    federated_dataset: str,
    sweep: bool,
    measure: Measure,
) -> Checked:
    """Every check of a loaded dataset against the spec: the model's size against the cap,
    federated silos, shard plans, privacy noise. In the request for most jobs; in the worker
    (jobs/worker_checks.py), with `measure` in a child process, for those needs_worker names."""
    from marketplace.jobs import scoring
    from marketplace.jobs.privacy import settle_noise

    if spec.scoring:  # every row, in the file's order
        scoring.check_data(spec, source, dataset)
        dataset = scoring.rows_dataset(dataset)
        checkpoint = source.weights if source else checkpoint
    lm = dataset.task == "language_model"
    footprint = measure(spec.model, tuple(dataset.input_shape), dataset.num_classes, lm,
                        checkpoint)  # fmt: skip
    too_big = cap.problems(footprint.parameters, footprint.state_bytes, why)
    if too_big:
        raise spec_error(too_big)
    if federated_dataset:
        _check_silos(federated_dataset, list(dataset.input_shape), dataset.num_classes)
    plans = (
        [] if federated_dataset
        else scoring.scoring_plans(spec, dataset) if spec.scoring
        else _plan(spec, dataset)
    )  # fmt: skip
    if sweep:
        plans = []  # checked; each trial cuts its own shards
    # a target ε without a noise multiplier: the noise that keeps max_rounds within it
    rows = min((plan.size for plan in plans), default=None)
    spec, privacy_problems = settle_noise(
        spec, tuple(dataset.input_shape), dataset.num_classes, rows
    )
    if privacy_problems:
        raise spec_error(privacy_problems)
    min_memory_gb = max(spec.requirements.min_memory_gb, _memory_gb(spec, footprint))
    return Checked(spec, dataset, plans, footprint, checkpoint, min_memory_gb)


def check_silos_declared(name: str) -> list:
    """A federated job needs some node to hold its dataset: one that no node declares is
    refused, nothing held (in the request: no dataset need be read). Returns the schemas
    the declaring nodes give it."""
    # filtered here, not in SQL: JSON containment is PostgreSQL's alone (a dev server runs
    # SQLite), and only nodes that declare some dataset are read
    held = Node.objects.exclude(local_datasets=[]).values_list(
        "local_datasets", "local_dataset_schemas"
    )
    schemas = [schemas for names, schemas in held if name in (names or [])]
    if not schemas:
        reason = (f"no node declares a local dataset named {name!r}; its owner declares it "
                  f"with 'gpuflex-node datasets add {name} PATH'")  # fmt: skip
        raise spec_error([("federated_dataset", reason)])
    return schemas


def _check_silos(name: str, input_shape: list[int], num_classes: int) -> None:
    """check_silos_declared, and some silo's rows must fit the model: a dataset declared only
    with rows of another shape is refused. Declared on nodes that are offline now, the job
    is accepted and waits for them (its page says so)."""
    schemas = check_silos_declared(name)
    misfits = [schema_misfit(input_shape, num_classes, (s or {}).get(name)) for s in schemas]
    if all(misfits):
        reason = f"every node holding {name!r} has data this job's model cannot take: {misfits[0]}"
        raise spec_error([("federated_dataset", reason)])


def _memory_gb(spec: JobSpec, footprint: Footprint) -> float:
    """What a task of the spec's batch takes (weights, gradients, optimizer state and
    activations; trainer.fit), the least memory a node needs to take one."""
    estimate = estimate_memory(
        footprint, optimizer=spec.optimizer.name, momentum=spec.optimizer.momentum,
        batch_size=spec.local.batch_size, grad_accum_steps=spec.local.grad_accum_steps,
    )  # fmt: skip
    return estimate.total / 2**30


def _plan(spec: JobSpec, dataset: Dataset) -> list:
    from marketplace.rounds import resharding
    from trainer.sharding import ShardingError

    num_shards = spec.sharding.num_shards or min(
        settings.GPUFLEX["DEFAULT_SHARDS"], dataset.num_train
    )
    try:
        plans = resharding.cut(spec, dataset, num_shards)  # capability: equal, nobody known yet
    except ShardingError as exc:
        raise spec_error([("sharding.num_shards", str(exc))]) from None
    _check_round_size(spec, len(plans))
    return plans


def _check_round_size(spec: JobSpec, shards: int) -> None:
    """Refuse a strategy that could not aggregate the updates a round closing on quorum
    brings (one per shard: replicas only verify each other), rather than fail at round 1."""
    from trainer.aggregation import round_size_problems

    quorum = spec.rounds.quorum
    source = f"{shards} shards, closing at quorum {quorum:g}"
    problems = round_size_problems(spec.aggregation, quorum_units(quorum, shards), source)
    if problems:
        raise spec_error(problems)
