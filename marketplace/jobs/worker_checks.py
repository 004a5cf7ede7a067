"""The checks a web request leaves to the worker: reading a dataset with the buyer's
tokenizer.json and measuring a Hugging Face config's model.

A job that names either (submission.needs_worker) is accepted on bounded checks alone (sizes,
JSON shape, the config's numbers) and stored without shards, its footprint {}. The worker that
prepares it (jobs/preparation.py) runs the rest here: the dataset read with its tokenizer, and
an hf_* model measured on the meta device, each in a child process under limits
(jobs/isolation.py), then every check a submission makes (checks.check_job: the model cap,
silos, shard plans, privacy noise).
What fails fails the job with the reason in its `error`, its escrow released; the worker
carries on with the next job.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path

from marketplace.jobs import files, isolation, scoring
from marketplace.jobs.checks import check_job, measure_here, spec_error
from marketplace.jobs.dataset_files import load_uploaded_dataset, tokenizer_name
from marketplace.jobs.limits import describe_cap, model_cap
from marketplace.jobs.model_files import (
    CHECKPOINT_FILE,
    PROGRAM_FILE,
    checkpoint_name,
    program_name,
)
from marketplace.jobs.models import Job, Shard
from marketplace.rounds import resharding
from trainer.datasets import Dataset, load_dataset
from trainer.spec import HF_ARCHS, JobSpec


def awaits_checks(job: Job) -> bool:
    """Accepted on bounded checks and not checked whole yet: no footprint measured."""
    return not job.footprint and job.kind != "sweep"


def check_in_worker(job: Job) -> Job:
    """Read, measure and check `job` (locked by the caller, in its transaction), and store
    what the request would have: its shards, footprint, data shape and settled spec.
    Raises the submission's InvalidSpec / InvalidDataset / TooLarge with the reason."""
    spec = job.parsed_spec
    written: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpuflex-checks-") as tmp, ExitStack() as stack:
        source = scoring.resolve_source(job.buyer, spec, Path(tmp))
        checkpoint = None
        if spec.model.checkpoint and source is None:
            checkpoint = Path(tmp) / CHECKPOINT_FILE
            checkpoint.write_bytes(files.get(checkpoint_name(job.pk)))
        dataset = _dataset(job, spec, stack)
        # transformers builds the buyer's config: measured in a child; a zoo model is ours,
        # bounded by the spec, and measured here on the meta device as a request measures it
        hf = spec.model.arch in HF_ARCHS
        measure = isolation.measure if hf else measure_here
        if spec.model.arch == "exported":  # measured on the meta device from a local copy
            measure = _program_measure(job, Path(tmp))
        checked = check_job(
            spec, dataset, checkpoint, source, cap=model_cap(job.tier, job.budget),
            why=describe_cap(job.tier, job.budget), federated_dataset=job.federated_dataset,
            sweep=False, measure=measure,
        )  # fmt: skip
        try:
            shards = resharding.write(job.pk, 0, checked.dataset, checked.plans, written)
            job.spec = checked.spec.to_dict()  # its privacy noise settled
            job.input_shape = list(checked.dataset.input_shape)
            job.num_classes = checked.dataset.num_classes
            job.task_kind = checked.dataset.task
            job.footprint = checked.footprint.to_dict()
            job.min_memory_gb = checked.min_memory_gb
            job.save(update_fields=["spec", "input_shape", "num_classes", "task_kind",
                                    "footprint", "min_memory_gb", "updated_at"])  # fmt: skip
            job.__dict__.pop("parsed_spec", None)  # the settled spec from now on
            Shard.objects.bulk_create(shards)
        except BaseException:
            files.delete_tree(written)
            raise
    return job


def _program_measure(job: Job, tmp: Path):
    """measure_here on the job's stored program, copied to `tmp`: its parameters and one
    sample's activations measured on the meta device (trainer.fit.measure_footprint), the
    gate run again on what was stored."""
    local = tmp / PROGRAM_FILE
    local.write_bytes(files.get(program_name(job.pk)))

    cap = model_cap(job.tier, job.budget)

    def measure(model, input_shape, num_classes, lm, checkpoint):  # type: ignore[no-untyped-def]
        here = model.model_copy(update={"program": str(local)})
        from trainer.exported.loader import largest_tensor_bytes

        footprint = measure_here(here, input_shape, num_classes, lm, checkpoint)
        # a graph may make tensors of any size from a sample (aten.full, new_zeros): one
        # sample's activations, and its largest tensor, are held to the bytes the job's cap
        # allows its weights, so that nothing the worker or a node runs allocates unbounded
        largest = largest_tensor_bytes(local, tuple(input_shape))
        for what, size in (("activations take", footprint.activation_bytes),
                           ("largest tensor takes", largest)):  # fmt: skip
            if size > cap.bytes:
                why = describe_cap(job.tier, job.budget)
                raise spec_error([("model.program", (
                    f"one sample's {what} {size / 2**20:,.1f} MiB; {why} allows at most "
                    f"{cap.bytes / 2**20:,.1f} MiB"))])  # fmt: skip
        return footprint

    return measure


def _dataset(job: Job, spec: JobSpec, stack: ExitStack) -> Dataset:
    """The job's stored dataset: with a tokenizer.json read in a child (its regexes run in
    Rust), else here, by the same loaders a request uses for every other job."""
    if not job.dataset_file:  # built in: no file of the buyer's
        return load_dataset(spec.dataset, seed=spec.seed)
    path = stack.enter_context(files.local_copy(job.dataset_file, Path(job.dataset_file).suffix))
    shown = spec.dataset.path or path.name
    if not spec.dataset.tokenizer:
        return load_uploaded_dataset(spec, path, shown)
    tokenizer = str(stack.enter_context(files.local_copy(tokenizer_name(job.pk))))
    local = spec.dataset.model_copy(update={"path": str(path), "tokenizer": tokenizer})
    return isolation.load_dataset(local, spec.seed, shown=shown)
