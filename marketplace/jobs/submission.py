"""Job submission: validate spec and dataset completely, then store everything at once.

Nothing is written before every check has passed, and files written before a failed
transaction are removed again, so a rejected job leaves nothing behind.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from contextlib import nullcontext
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from marketplace.accounts.models import User
from marketplace.jobs import files
from marketplace.jobs.checks import (
    check_hf_size,
    check_job,
    check_silos_declared,
    measure_here,
    needs_worker,
    spec_error,
)
from marketplace.jobs.dataset_files import (
    SUFFIXES,
    check_dataset_file,
    load_uploaded_dataset,
    receive_tokenizer,
    stored_name,
    tokenizer_name,
)
from marketplace.jobs.errors import InvalidDataset, MarketplaceError, TooLarge
from marketplace.jobs.limits import describe_cap, model_cap
from marketplace.jobs.market import ANY_PRICE, market_price
from marketplace.jobs.model_files import checkpoint_name, program_name, receive_model_files
from marketplace.jobs.models import Job, Shard, Tier
from marketplace.ledger.services import check_credit, fund_child, hold_budget
from marketplace.rounds.planning import JobNeeds
from marketplace.uploads import services as uploads
from marketplace.uploads.models import Upload
from trainer.fit import Footprint
from trainer.nesting import TooDeep, check_depth, loads_json, loads_yaml
from trainer.spec import JobSpec, SpecError, parse_spec

if TYPE_CHECKING:
    from trainer.datasets import Dataset

UPLOAD_KINDS = frozenset(SUFFIXES)
BUILTIN_KINDS = {"digits"}
SHARDING_METHODS = {"random", "stratified", "capability", "length"}
# What the trainer accepts but the marketplace cannot run, and why (docs/job-spec.md).
REFUSED_SHARDING = {
    "prepartitioned": "it is for federated jobs, whose nodes hold their own data (name it "
    "in federated_dataset)",
}


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
                    raise spec_error([("<file>", f"not valid YAML/JSON: {exc}")]) from None
        else:
            check_depth(raw)
    except TooDeep as exc:
        raise spec_error([("<file>", str(exc))]) from None
    try:
        spec = parse_spec(raw)
    except SpecError as exc:
        raise spec_error(exc.problems) from None
    problems = _unsupported(spec, federated)
    if problems:
        raise spec_error(problems)
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
    if spec.model.arch == "exported" and spec.adaptation.enabled:
        # the round planner sizes work from a model it builds from the spec alone
        # (rounds/sizing.model_numel); an exported program is a stored file
        problems.append(("adaptation.enabled", "network-aware rounds do not take an exported "
                         "model (model.arch: exported) yet; leave adaptation off"))  # fmt: skip
    return problems


def _receive(
    spec: JobSpec,
    upload: UploadedFile | None,
    tmp: Path,
    assembled: Path | None = None,
) -> Path | None:
    """The dataset's file, unread: built in (None), an uploaded file (written to `tmp` first,
    within the size limit), or `assembled`, a finished chunked upload's file (uploads/) or a
    sweep's stored dataset, read in place."""
    kind = spec.dataset.kind
    if kind in BUILTIN_KINDS:
        if upload is not None or assembled is not None:
            raise InvalidDataset(f"Dataset kind {kind!r} is built in; do not upload a file.")
        return None
    if assembled is not None:
        return assembled
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
    return path


def _load(
    spec: JobSpec,
    upload: UploadedFile | None,
    tokenizer: Path | None,
    tmp: Path,
    assembled: Path | None = None,
    assembled_name: str = "",
) -> tuple[Dataset, Path | None]:
    """The dataset, checked by its format's loader (jobs/dataset_files.py) from the file
    _receive gives; `assembled_name` is the buyer's name for an assembled file."""
    from trainer.datasets import load_dataset

    path = _receive(spec, upload, tmp, assembled)
    if path is None:
        return load_dataset(spec.dataset, seed=spec.seed), None
    if path == assembled:
        shown = assembled_name or path.name
    else:
        shown = Path(upload.name or "dataset").name  # type: ignore[union-attr]
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
    model_program: UploadedFile | None = None,
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
    from marketplace.jobs.scoring_source import resolve_source

    if max_price_per_gpu_hour is not None and max_price_per_gpu_hour <= 0:
        # a job at price 0 was accepted and its tasks leased
        raise MarketplaceError(
            "max_price_per_gpu_hour must be more than 0.", field="max_price_per_gpu_hour"
        )
    spec = parse_job_spec(spec_data, federated=bool(federated_dataset))
    if spec.scoring and federated_dataset:
        raise spec_error([("kind", f"a {spec.kind} job scores an uploaded dataset, not a "
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
        source = resolve_source(buyer, spec, Path(tmp))
        if source is not None and source.spec.model.arch == "exported":
            raise spec_error([("source.job", "scoring an exported model (model.arch: exported) "
                               "is not supported yet; download it with --format pt2")])  # fmt: skip
        received = receive_model_files(
            source.spec if source else spec, model_config, model_checkpoint, Path(tmp),
            cap.checkpoint_bytes, model_program,
        )  # fmt: skip
        spec = received.spec
        check_hf_size(spec, cap, describe_cap(tier, budget))
        tokenizer = receive_tokenizer(spec, dataset_tokenizer, Path(tmp))
        shown_name = chunked.filename if chunked else (spec.dataset.path or "") if parent else ""
        common = {"buyer": buyer, "tokenizer": tokenizer, "tier": tier, "budget": budget,
                  "parent": parent, "federated_dataset": federated_dataset,
                  "chunked": chunked}  # fmt: skip
        if parent is None or needs_worker(spec):
            # the checks that need no torch, here (a 4xx at once); the worker that prepares
            # the job reads its dataset and measures its model (jobs/worker_checks.py), so
            # the web process never imports torch (issue 36). A sweep's trials are
            # submitted by a worker (marketplace/sweeps), which checks each whole below.
            if tokenizer is not None:
                _check_tokenizer_json(tokenizer)
            if received.checkpoint is not None:  # its safetensors header: names, shapes, dtypes
                _check_header(received.checkpoint)
            if federated_dataset:  # rows that fit the model: the worker, with its shape
                check_silos_declared(federated_dataset)
            local_path = _receive(spec, dataset_upload, Path(tmp), assembled)
            if local_path is not None:
                shown = shown_name or Path(dataset_upload.name if dataset_upload else "").name
                check_dataset_file(spec, local_path, shown or local_path.name)
            checkpoint = source.weights if source else received.checkpoint
            min_memory_gb = spec.requirements.min_memory_gb
            return _store(spec=_shown(stored_sweep or spec, dataset_upload, chunked), dataset=None,
                          dataset_path=local_path, plans=[], checkpoint=checkpoint,
                          footprint=None, min_memory_gb=min_memory_gb,
                          program=received.program,
                          max_price=_price(spec, max_price_per_gpu_hour, min_memory_gb, tier),
                          **common)  # fmt: skip
        dataset, local_path = _load(
            spec, dataset_upload, tokenizer, Path(tmp), assembled, shown_name
        )
        checked = check_job(
            spec, dataset, received.checkpoint, source, cap=cap, why=describe_cap(tier, budget),
            federated_dataset=federated_dataset, sweep=stored_sweep is not None,
            measure=measure_here,
        )  # fmt: skip
        return _store(
            spec=_shown(stored_sweep or checked.spec, dataset_upload, chunked),
            dataset=checked.dataset,
            dataset_path=local_path,
            plans=checked.plans,
            checkpoint=checked.checkpoint,
            footprint=checked.footprint,
            min_memory_gb=checked.min_memory_gb,
            max_price=_price(spec, max_price_per_gpu_hour, checked.min_memory_gb, tier),
            **common,
        )


def _shown(spec: JobSpec, upload: UploadedFile | None, chunked: Upload | None) -> JobSpec:
    """The spec as stored: its dataset path the buyer's own name for the uploaded file."""
    if upload is None and chunked is None:
        return spec
    named = chunked.filename if chunked else upload.name  # type: ignore[union-attr]
    shown = Path(named or "dataset").name
    return spec.replace(dataset=spec.dataset.model_copy(update={"path": shown}))


def _check_header(path: Path) -> None:
    """Its header read in pure Python (trainer/tensor_header.py); the worker checks the
    tensors against the model it builds."""
    from trainer.tensor_header import HeaderError, read_header

    try:
        read_header(path)
    except HeaderError as exc:
        reason = f"the checkpoint is not a readable safetensors file: {exc}"
        raise spec_error([("model.checkpoint", reason)]) from None


def _check_tokenizer_json(path: Path) -> None:
    """Size, UTF-8, JSON nesting and shape: never the tokenizers library, in a request."""
    from trainer.datasets import DatasetError
    from trainer.datasets.tokenizer import read_tokenizer_json

    try:
        read_tokenizer_json(path)
    except DatasetError as exc:
        raise InvalidDataset(f"The dataset cannot be used: {exc}") from None


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
    if (
        model_config is not None
        or model_checkpoint is not None
        or spec.model.checkpoint
        or (spec.model.program)
    ):
        problems.append(("model.checkpoint", "a sweep's trials start from the seed's weights; "
                         "uploaded model files are not passed on to them"))  # fmt: skip
    if dataset_tokenizer is not None or spec.dataset.tokenizer:
        problems.append(("dataset.tokenizer", "a sweep's trials do not take a tokenizer "
                         "upload; use byte-level tokens"))  # fmt: skip
    if problems:
        raise spec_error(problems)


def _price(spec: JobSpec, given: Decimal | None, min_memory_gb: float, tier: str) -> Decimal:
    """The job's price cap: the request's (the market's when it gives none), lowered to the
    spec's own where it names one."""
    if given is None:
        given = market_price(_needs(spec, min_memory_gb), tier)
    return _max_price(spec, given)


def _needs(spec: JobSpec, min_memory_gb: float) -> JobNeeds:
    """What the job will ask of a node (its row's NEEDS_FIELDS), any price."""
    r = spec.requirements
    return JobNeeds(ANY_PRICE, min_memory_gb, r.min_vram_gb, r.min_fp32_tflops,
                    r.gpu_required, r.isolation == "full", spec.needs_gpu_runtime,
                    spec.runtime.min_torch or "")  # fmt: skip


def _max_price(spec: JobSpec, given: Decimal) -> Decimal:
    """The lower of the request's price cap and the spec's own, when it names one."""
    cap = spec.requirements.max_price_per_hour
    return given if cap is None else min(given, Decimal(str(cap)))


def _store(
    *,
    buyer: User,
    spec: JobSpec,
    dataset: Dataset | None,
    dataset_path: Path | None,
    tokenizer: Path | None,
    plans: list,
    checkpoint: Path | None,
    footprint: Footprint | None,
    min_memory_gb: float,
    tier: str,
    budget: Decimal,
    max_price: Decimal,
    federated_dataset: str,
    chunked: Upload | None = None,
    parent: Job | None = None,
    program: Path | None = None,
) -> Job:
    """Write the job's files and rows. `dataset` and `footprint` None: a job accepted on
    bounded checks (needs_worker), without shards, its footprint {} until the worker that
    prepares it has read and measured it (jobs/worker_checks.py)."""
    from marketplace.jobs.preparation_queue import enqueue_preparation

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
        if program is not None:  # an exported model: the worker measures it, nodes get it
            written.append(files.put_file(program_name(job_id), program))
        shard_rows = []
        if dataset is not None:  # a sweep's: its trials cut their own (no torch otherwise)
            from marketplace.rounds import resharding

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
                input_shape=list(dataset.input_shape) if dataset else [],
                num_classes=dataset.num_classes if dataset else 0,
                task_kind=dataset.task if dataset else _task_kind(spec),
                min_memory_gb=min_memory_gb,
                footprint=footprint.to_dict() if footprint else {},
                min_vram_gb=spec.requirements.min_vram_gb,
                min_fp32_tflops=spec.requirements.min_fp32_tflops,
                gpu_required=spec.requirements.gpu_required,
                isolation_full=spec.requirements.isolation == "full",
                gpu_runtime_required=spec.needs_gpu_runtime,
                min_torch=spec.runtime.min_torch or "",
                proximal_mu=_proximal_mu(spec),
                parent=parent,
            )
            if parent is not None:
                fund_child(parent, job)  # from the sweep's escrow
            else:
                hold_budget(job)  # re-checked under the account's lock
            if chunked is not None:
                uploads.use_upload(chunked, job.pk)
            Shard.objects.bulk_create(shard_rows)
            enqueue_preparation(job.pk)  # (checks,) builds the model and opens round 1
    except BaseException:
        files.delete_tree(written)
        raise
    return job


def _proximal_mu(spec: JobSpec) -> float:
    """FedProx's proximal term, sent to nodes with each task (the spec bounds it >= 0); 0
    for every other strategy (trainer.aggregation.FedProx, without importing torch)."""
    return spec.aggregation.mu if spec.aggregation.strategy == "fedprox" else 0.0


def _task_kind(spec: JobSpec) -> str:
    """Until the worker has read the dataset: a text corpus is language modelling."""
    return "language_model" if spec.dataset.kind == "text" else "classification"
