"""Job submission: validate spec and dataset completely, then store everything at once.

Nothing is written before every check has passed, and files written before a failed
transaction are removed again, so a rejected job leaves nothing behind.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from contextlib import nullcontext
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from marketplace.accounts.models import User
from marketplace.jobs import files, scoring
from marketplace.jobs.dataset_files import (
    SUFFIXES,
    load_uploaded_dataset,
    receive_tokenizer,
    stored_name,
    tokenizer_name,
)
from marketplace.jobs.errors import InvalidDataset, InvalidSpec, MarketplaceError, TooLarge
from marketplace.jobs.limits import describe_cap, model_cap
from marketplace.jobs.market import ANY_PRICE, market_price
from marketplace.jobs.model_files import checkpoint_name, receive_model_files
from marketplace.jobs.models import Job, Shard, Tier
from marketplace.jobs.preparation import enqueue_preparation
from marketplace.jobs.privacy import settle_noise
from marketplace.ledger.services import check_credit, fund_child, hold_budget
from marketplace.nodes.models import Node
from marketplace.rounds import resharding
from marketplace.rounds.lifecycle import quorum_units, schema_misfit
from marketplace.rounds.planning import JobNeeds
from marketplace.uploads import services as uploads
from marketplace.uploads.models import Upload
from trainer.aggregation import build_strategy, round_size_problems
from trainer.datasets import Dataset, load_dataset
from trainer.fit import Footprint, estimate_memory, measure_footprint
from trainer.models import ModelSpecError, meta_weights
from trainer.nesting import TooDeep, check_depth, loads_json, loads_yaml
from trainer.sharding import ShardingError
from trainer.spec import JobSpec, SpecError, parse_spec

UPLOAD_KINDS = frozenset(SUFFIXES)
BUILTIN_KINDS = {"digits"}
SHARDING_METHODS = {"random", "stratified", "capability", "length"}
# What the trainer accepts but the marketplace cannot run, and why (docs/job-spec.md).
REFUSED_SHARDING = {
    "prepartitioned": "it is for federated jobs, whose nodes hold their own data (name it "
    "in federated_dataset)",
}


def _problems(problems: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"field": field, "reason": reason} for field, reason in problems]


def _spec_error(problems: list[tuple[str, str]]) -> InvalidSpec:
    sentence = "; ".join(f"{field}: {reason}" for field, reason in problems)
    return InvalidSpec(f"The job spec is invalid: {sentence}.", problems=_problems(problems))


def parse_job_spec(raw: Any, federated: bool = False) -> JobSpec:
    """A spec given as a mapping, or as JSON / YAML text; errors name the field path."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    try:
        if isinstance(raw, str):
            try:
                raw = loads_json(raw)
            except json.JSONDecodeError:
                try:
                    raw = loads_yaml(raw)
                except yaml.YAMLError as exc:
                    raise _spec_error([("<file>", f"not valid YAML/JSON: {exc}")]) from None
        else:
            check_depth(raw)
    except TooDeep as exc:
        raise _spec_error([("<file>", str(exc))]) from None
    try:
        spec = parse_spec(raw)
    except SpecError as exc:
        raise _spec_error(exc.problems) from None
    problems = _unsupported(spec, federated)
    if problems:
        raise _spec_error(problems)
    return spec


def _unsupported(spec: JobSpec, federated: bool) -> list[tuple[str, str]]:
    """Fields the trainer accepts but the marketplace cannot run, each with the reason."""
    problems = []
    kind = spec.dataset.kind
    method = spec.sharding.method
    if kind not in BUILTIN_KINDS | UPLOAD_KINDS:
        problems.append(("dataset.kind", f"{kind!r} is not supported by the marketplace"))
    if federated:
        # silos hold their own data: the server cannot cut it, nor count it for epochs
        if method != "prepartitioned":
            problems.append(("sharding.method", "a federated job uses 'prepartitioned' data"))
        if spec.local.steps is None:
            problems.append(("local.steps", "a federated job needs steps (silo sizes are unknown)"))
        if spec.sharding.elastic:
            problems.append(
                ("sharding.elastic", "a federated job's silos hold their own data: none to re-cut")
            )
    elif method not in SHARDING_METHODS:
        reason = REFUSED_SHARDING.get(method, "the marketplace cannot cut shards this way")
        problems.append(
            ("sharding.method", f"{method!r} is not supported by the marketplace: {reason}")
        )
    elif method == "length" and kind != "text":
        problems.append(("sharding.method", "'length' cuts sequence data (dataset kind 'text')"))
    return problems


def _load(
    spec: JobSpec,
    upload: UploadedFile | None,
    tokenizer: Path | None,
    tmp: Path,
    assembled: Path | None = None,
    assembled_name: str = "",
) -> tuple[Dataset, Path | None]:
    """The dataset, checked by its format's loader (jobs/dataset_files.py): built in, an
    uploaded file (written to `tmp` first), or `assembled`, a finished chunked upload's file
    (uploads/) read in place, `assembled_name` being the buyer's name for it."""
    kind = spec.dataset.kind
    if kind in BUILTIN_KINDS:
        if upload is not None or assembled is not None:
            raise InvalidDataset(f"Dataset kind {kind!r} is built in; do not upload a file.")
        return load_dataset(spec.dataset, seed=spec.seed), None
    if assembled is not None:
        shown = assembled_name or assembled.name
        return load_uploaded_dataset(spec, assembled, shown, tokenizer), assembled
    if upload is None:
        path = spec.dataset.path
        named = f" (the spec's dataset.path names {path!r})" if path else ""
        raise InvalidDataset(
            f"Dataset kind {kind!r} needs its file uploaded{named}: send it in the 'dataset' "
            "field, or a finished upload's id in 'dataset_upload'."
        )
    limit = settings.GPUFLEX["MAX_DATASET_BYTES"]
    if upload.size is not None and upload.size > limit:
        raise TooLarge(
            f"The dataset upload is {upload.size} bytes; the limit is {limit} bytes. Send "
            "larger files as a chunked upload (docs/uploads.md) and name it in 'dataset_upload'."
        )
    shown = Path(upload.name or "dataset").name
    path = tmp / stored_name(kind, shown)
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    return load_uploaded_dataset(spec, path, shown, tokenizer), path


def submit_job(
    *,
    buyer: User,
    spec_data: Any,
    dataset_upload: UploadedFile | None = None,
    tier: str = Tier.HYBRID,
    budget: Decimal,
    max_price_per_gpu_hour: Decimal | None = None,
    federated_dataset: str = "",
    model_config: UploadedFile | None = None,
    model_checkpoint: UploadedFile | None = None,
    dataset_upload_id: object = None,
    dataset_tokenizer: UploadedFile | None = None,
    parent: Job | None = None,
) -> Job:
    """Validate and store a job, holding its budget in escrow. With `federated_dataset`,
    nodes holding that named local dataset train on it; the job's own dataset is then only
    used for evaluation. `model_config` / `model_checkpoint`: an hf_* model's config.json
    and initial weights (jobs/model_files.py). `dataset_upload_id`: a finished chunked
    upload (marketplace/uploads) as the dataset instead of `dataset_upload` inline; its file
    is checked like an inline one, the job keeps its own copy, and the upload is used up.
    `dataset_tokenizer`: a text dataset's tokenizer.json (jobs/dataset_files.py).

    A sweep (`kind: sweep`) is checked as its trials' base spec would be, and stored with its
    dataset but no shards: its trials are submitted here too, each with `parent` (the
    sweep, which funds it from its escrow and whose dataset file it reads).

    `max_price_per_gpu_hour` None: the market's price for it (jobs/market.py), the median
    asking price of the online nodes that fit its requirements and tier."""
    if max_price_per_gpu_hour is not None and max_price_per_gpu_hour <= 0:
        # a job at price 0 was accepted and its tasks leased
        raise MarketplaceError(
            "max_price_per_gpu_hour must be more than 0.", field="max_price_per_gpu_hour"
        )
    spec = parse_job_spec(spec_data, federated=bool(federated_dataset))
    if spec.scoring and federated_dataset:
        raise _spec_error([("kind", f"a {spec.kind} job scores an uploaded dataset, not a "
                            "federated one")])  # fmt: skip
    if spec.kind == "sweep":
        _check_sweep(spec, federated_dataset, model_config, model_checkpoint, dataset_tokenizer)
    stored_sweep = spec if spec.kind == "sweep" else None
    if stored_sweep is not None:  # every check below is the trials' base spec's
        spec = parse_spec(spec.trial_base())
    if parent is None:
        check_credit(buyer, budget)
    cap = model_cap(tier, budget)
    chunked = None
    if dataset_upload_id is not None:
        if dataset_upload is not None:
            raise InvalidDataset("Give the dataset inline or as an upload id, not both.")
        chunked = uploads.dataset_upload(buyer, dataset_upload_id)
    # a trial reads its sweep's stored dataset, as a finished chunked upload is read
    stored_file = chunked.stored_name if chunked else parent.dataset_file if parent else ""
    with (
        tempfile.TemporaryDirectory(prefix="gpuflex-upload-") as tmp,
        files.local_copy(stored_file) if stored_file else nullcontext() as assembled,
    ):
        # evaluate / inference from a finished job: its model section and final weights
        source = scoring.resolve_source(buyer, spec, Path(tmp))
        received = receive_model_files(
            source.spec if source else spec, model_config, model_checkpoint, Path(tmp),
            cap.checkpoint_bytes,
        )  # fmt: skip
        spec = received.spec
        tokenizer = receive_tokenizer(spec, dataset_tokenizer, Path(tmp))
        shown_name = chunked.filename if chunked else (spec.dataset.path or "") if parent else ""
        dataset, local_path = _load(
            spec, dataset_upload, tokenizer, Path(tmp), assembled, shown_name
        )
        if spec.scoring:  # every row, in the file's order
            scoring.check_data(spec, source, dataset)
            dataset = scoring.rows_dataset(dataset)
            received = replace(
                received, checkpoint=source.weights if source else received.checkpoint
            )
        try:
            # measured and tried on the meta device, the checkpoint checked by its header:
            # the weights are built by a worker (jobs/preparation.py), never in this request
            lm = dataset.task == "language_model"
            weights = meta_weights(received.checkpoint) if received.checkpoint else None
            footprint = measure_footprint(
                spec.model, dataset.input_shape, dataset.num_classes, lm, weights
            )
        except ModelSpecError as exc:
            field = "model.checkpoint" if "checkpoint" in str(exc) else "model.arch"
            raise _spec_error([(field, str(exc))]) from None
        nbytes = footprint.state_bytes
        too_big = cap.problems(footprint.parameters, nbytes, describe_cap(tier, budget))
        if too_big:
            raise _spec_error(too_big)
        if federated_dataset:
            _check_silos(federated_dataset, list(dataset.input_shape), dataset.num_classes)
        plans = (
            [] if federated_dataset
            else scoring.scoring_plans(spec, dataset) if spec.scoring
            else _plan(spec, dataset)
        )  # fmt: skip
        if stored_sweep is not None:
            plans = []  # checked; each trial cuts its own shards
        # a target ε without a noise multiplier: the noise that keeps max_rounds within it
        rows = min((plan.size for plan in plans), default=None)
        spec, privacy_problems = settle_noise(
            spec, tuple(dataset.input_shape), dataset.num_classes, rows
        )
        if privacy_problems:
            raise _spec_error(privacy_problems)
        stored_spec = stored_sweep or spec
        if dataset_upload is not None or chunked is not None:
            named = chunked.filename if chunked else dataset_upload.name  # type: ignore[union-attr]
            shown = Path(named or "dataset").name
            stored_spec = stored_spec.replace(
                dataset=stored_spec.dataset.model_copy(update={"path": shown})
            )
        min_memory_gb = max(spec.requirements.min_memory_gb, _memory_gb(spec, footprint))
        if max_price_per_gpu_hour is None:
            max_price_per_gpu_hour = market_price(_needs(spec, min_memory_gb), tier)
        return _store(
            buyer=buyer,
            spec=stored_spec,
            dataset=dataset,
            dataset_path=local_path,
            tokenizer=tokenizer,
            plans=plans,
            checkpoint=received.checkpoint,
            footprint=footprint,
            min_memory_gb=min_memory_gb,
            tier=tier,
            budget=budget,
            max_price=_max_price(spec, max_price_per_gpu_hour),
            federated_dataset=federated_dataset,
            chunked=chunked,
            parent=parent,
        )


def _check_sweep(
    spec: JobSpec,
    federated_dataset: str,
    model_config: UploadedFile | None,
    model_checkpoint: UploadedFile | None,
    dataset_tokenizer: UploadedFile | None,
) -> None:
    """What a sweep cannot take (yet): its trials are submitted from the sweep's stored
    spec and dataset, which keep no model files, tokenizer or silos."""
    problems = []
    if federated_dataset:
        problems.append(("federated_dataset", "a sweep's trials train on an uploaded or "
                         "built-in dataset, not a federated one"))  # fmt: skip
    if model_config is not None or model_checkpoint is not None or spec.model.checkpoint:
        problems.append(("model.checkpoint", "a sweep's trials start from the seed's weights; "
                         "uploaded model files are not passed on to them"))  # fmt: skip
    if dataset_tokenizer is not None or spec.dataset.tokenizer:
        problems.append(("dataset.tokenizer", "a sweep's trials do not take a tokenizer "
                         "upload; use byte-level tokens"))  # fmt: skip
    if problems:
        raise _spec_error(problems)


def _check_silos(name: str, input_shape: list[int], num_classes: int) -> None:
    """A federated job needs some node to hold its dataset: one that no node declares (or
    only with rows of another shape) is refused, nothing held. Declared on nodes that are
    offline now, the job is accepted and waits for them (its page says so)."""
    # filtered here, not in SQL: JSON containment is PostgreSQL's alone (a dev server runs
    # SQLite), and only nodes that declare some dataset are read
    held = Node.objects.exclude(local_datasets=[]).values_list(
        "local_datasets", "local_dataset_schemas"
    )
    schemas = [schemas for names, schemas in held if name in (names or [])]
    if not schemas:
        reason = (f"no node declares a local dataset named {name!r}; its owner declares it "
                  f"with 'gpuflex-node datasets add {name} PATH'")  # fmt: skip
        raise _spec_error([("federated_dataset", reason)])
    misfits = [schema_misfit(input_shape, num_classes, (s or {}).get(name)) for s in schemas]
    if all(misfits):
        reason = f"every node holding {name!r} has data this job's model cannot take: {misfits[0]}"
        raise _spec_error([("federated_dataset", reason)])


def _memory_gb(spec: JobSpec, footprint: Footprint) -> float:
    """What a task of the spec's batch takes (weights, gradients, optimizer state and
    activations; trainer.fit), the least memory a node needs to take one."""
    estimate = estimate_memory(
        footprint, optimizer=spec.optimizer.name, momentum=spec.optimizer.momentum,
        batch_size=spec.local.batch_size, grad_accum_steps=spec.local.grad_accum_steps,
    )  # fmt: skip
    return estimate.total / 2**30


def _plan(spec: JobSpec, dataset: Dataset) -> list:
    num_shards = spec.sharding.num_shards or min(
        settings.GPUFLEX["DEFAULT_SHARDS"], dataset.num_train
    )
    try:
        plans = resharding.cut(spec, dataset, num_shards)  # capability: equal, nobody known yet
    except ShardingError as exc:
        raise _spec_error([("sharding.num_shards", str(exc))]) from None
    _check_round_size(spec, len(plans))
    return plans


def _check_round_size(spec: JobSpec, shards: int) -> None:
    """Refuse a strategy that could not aggregate the updates a round closing on quorum
    brings (one per shard: replicas only verify each other), rather than fail at round 1."""
    quorum = spec.rounds.quorum
    source = f"{shards} shards, closing at quorum {quorum:g}"
    problems = round_size_problems(spec.aggregation, quorum_units(quorum, shards), source)
    if problems:
        raise _spec_error(problems)


def _needs(spec: JobSpec, min_memory_gb: float) -> JobNeeds:
    """What the job will ask of a node (its row's NEEDS_FIELDS), any price."""
    r = spec.requirements
    return JobNeeds(ANY_PRICE, min_memory_gb, r.min_vram_gb, r.min_fp32_tflops,
                    r.gpu_required, r.isolation == "full")  # fmt: skip


def _max_price(spec: JobSpec, given: Decimal) -> Decimal:
    """The lower of the request's price cap and the spec's own, when it names one."""
    cap = spec.requirements.max_price_per_hour
    return given if cap is None else min(given, Decimal(str(cap)))


def _store(
    *,
    buyer: User,
    spec: JobSpec,
    dataset: Dataset,
    dataset_path: Path | None,
    tokenizer: Path | None,
    plans: list,
    checkpoint: Path | None,
    footprint: Footprint,
    min_memory_gb: float,
    tier: str,
    budget: Decimal,
    max_price: Decimal,
    federated_dataset: str,
    chunked: Upload | None = None,
    parent: Job | None = None,
) -> Job:
    job_id = uuid.uuid4()
    base = files.job_dir(job_id)
    written: list[str] = []
    try:
        dataset_file = ""
        if dataset_path is not None:  # streamed: a chunked upload runs to gigabytes
            # named dataset<suffix>, the suffix its format is read by (jobs/dataset_files.py)
            shown = spec.dataset.path or dataset_path.name
            dataset_file = files.put_file(
                f"{base}/{stored_name(spec.dataset.kind, shown)}", dataset_path
            )
            written.append(dataset_file)
        if tokenizer is not None:  # jobs/datasets.py re-loads the text with it
            written.append(files.put(tokenizer_name(job_id), tokenizer.read_bytes()))
        if checkpoint is not None:  # jobs/preparation.py builds round 1's model from it
            written.append(files.put(checkpoint_name(job_id), checkpoint.read_bytes()))
        shard_rows = resharding.write(job_id, 0, dataset, plans, written)
        with transaction.atomic():
            job = Job.objects.create(
                id=job_id,
                buyer=buyer,
                name=spec.name,
                spec=spec.to_dict(),
                tier=tier,
                budget=budget,
                max_price_per_gpu_hour=max_price,
                dataset_file=dataset_file,
                federated_dataset=federated_dataset,
                input_shape=list(dataset.input_shape),
                num_classes=dataset.num_classes,
                task_kind=dataset.task,
                min_memory_gb=min_memory_gb,
                footprint=footprint.to_dict(),
                min_vram_gb=spec.requirements.min_vram_gb,
                min_fp32_tflops=spec.requirements.min_fp32_tflops,
                gpu_required=spec.requirements.gpu_required,
                isolation_full=spec.requirements.isolation == "full",
                proximal_mu=build_strategy(spec.aggregation).proximal_mu,
                parent=parent,
            )
            if parent is not None:
                fund_child(parent, job)  # from the sweep's escrow
            else:
                hold_budget(job)  # re-checked under the account's lock
            if chunked is not None:
                uploads.use_upload(chunked, job.pk)
            Shard.objects.bulk_create(shard_rows)
            enqueue_preparation(job.pk)  # builds the model and opens round 1
    except BaseException:
        files.delete_tree(written)
        raise
    return job
