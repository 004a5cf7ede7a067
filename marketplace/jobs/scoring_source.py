"""A scoring job's source (an evaluate or inference job naming `source.job`): the buyer's own
finished training job and its final model, found without torch, so a web request resolves it
(jobs/scoring.py, which the worker runs, holds the rest)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from marketplace.accounts.models import User
from marketplace.jobs import files
from marketplace.jobs.errors import InvalidSpec
from marketplace.jobs.models import Job, JobStatus
from trainer.spec import JobSpec

# the file a source job's final model is written to in the request's temporary folder,
# where an uploaded checkpoint would be
SOURCE_WEIGHTS = "source-weights.safetensors"


def _invalid(field: str, reason: str) -> InvalidSpec:
    return InvalidSpec(
        f"The job spec is invalid: {field}: {reason}.",
        problems=[{"field": field, "reason": reason}],
    )


@dataclass(frozen=True)
class Source:
    spec: JobSpec  # with the source job's model section
    weights: Path  # its final model, in the request's temporary folder
    job: Job


def resolve_source(buyer: User, spec: JobSpec, tmp: Path) -> Source | None:
    """A scoring spec's `source.job`: the buyer's own finished training job with a model.
    None when the spec brings its own checkpoint instead."""
    if spec.source is None:
        return None
    job = Job.objects.filter(pk=spec.source.job, buyer=buyer).first()
    if job is None:
        raise _invalid("source.job", "you have no job with this id")
    if job.parsed_spec.kind != "train":
        raise _invalid("source.job", f"it is a {job.parsed_spec.kind} job; name a training job")
    if job.status not in (JobStatus.COMPLETED, JobStatus.STOPPED) or not job.model_file:
        raise _invalid("source.job", f"the job is {job.status} and has no final model yet")
    path = tmp / SOURCE_WEIGHTS
    path.write_bytes(files.get(job.model_file))
    # the source's own initial-weights name means nothing here: its final model is the model
    model = job.parsed_spec.model.model_copy(update={"checkpoint": None})
    return Source(spec.replace(model=model), path, job)
