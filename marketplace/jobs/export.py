"""A job's latest model in a download format (trainer/export.py), for the API and the web page.

`safetensors` is the stored file itself (unchanged, so its hash header still holds); the
others are made on first request and kept beside the job's models, named by the model's hash,
so a second download (or another web server) finds them instead of exporting again. `pt2` is
made here (the buyer's program with the trained weights, no torch); onnx, torchscript and hf
build the model with torch, so a worker makes them (jobs/export_making.py) while the request
answers Pending (a 202), and the next request after it is done downloads it (issue 36).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.files.storage import default_storage

from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError
from marketplace.jobs.export_requests import request_export
from marketplace.jobs.models import ExportStatus, Job
from trainer.export_formats import FORMATS, hf_refusal


class BadFormat(MarketplaceError):
    """A format this job's model cannot be exported to: a 400 naming the parameter."""

    code = "invalid_format"


@dataclass(frozen=True)
class Download:
    data: bytes
    filename: str
    content_type: str


@dataclass(frozen=True)
class Pending:
    """An export a worker is making: the API answers 202 with Retry-After."""

    format: str
    model_hash: str
    retry_after: int

    @property
    def detail(self) -> str:
        return (
            f"The {self.format} export of model {self.model_hash[:12]} is being made; "
            f"ask again in {self.retry_after} s."
        )


SUFFIX = {"safetensors": ".safetensors", "torchscript": ".torchscript.pt", "onnx": ".onnx",
          "hf": ".hf.zip", "pt2": ".pt2"}  # fmt: skip
# an exported model (model.arch: exported) is the buyer's program: it goes back as that
# program with the trained weights (trainer/exported/repack.py), or as its weights
PROGRAM_FORMATS = ("safetensors", "pt2")
# how long a buyer waits before asking again for an export being made (Retry-After): a small
# model's export takes a worker a few seconds
RETRY_AFTER_S = 5


def model_job(job: Job) -> Job:
    """The job whose model section describes `job`'s model: a sweep's model is its best
    trial's (marketplace/sweeps), whose width or layers may differ from the sweep's base."""
    if job.kind == "sweep" and job.model_file:
        best = job.children.filter(model_file=job.model_file).first()
        if best is not None:
            return best
    return job


def formats_for(job: Job) -> list[str]:
    """The formats this job's architecture exports to, in the order pages list them."""
    spec = model_job(job).parsed_spec
    if spec.model.arch == "exported":
        return list(PROGRAM_FORMATS)
    return [f for f in FORMATS if f != "pt2" and (f != "hf" or hf_refusal(spec.model) is None)]


def check_format(job: Job, fmt: str) -> None:
    if fmt not in FORMATS:
        raise BadFormat(
            f"format: unknown format {fmt!r}; one of {', '.join(FORMATS)}.", parameter="format"
        )
    model = model_job(job).parsed_spec.model
    reason = hf_refusal(model) if fmt == "hf" else None
    if (model.arch == "exported") != (fmt == "pt2") and fmt != "safetensors":
        reason = (
            f"an exported model downloads as {' or '.join(PROGRAM_FORMATS)}"
            if model.arch == "exported"
            else f"format 'pt2' is for exported models; model.arch is '{model.arch}'"
        )
    if reason:
        raise BadFormat(f"format: {reason}.", parameter="format")


def export_name(job_id: object, model_hash: str, fmt: str) -> str:
    """Where an export of the model with this hash is kept, beside the job's models."""
    return f"{files.job_dir(job_id)}/exports/{model_hash}{SUFFIX[fmt]}"


def job_model_download(job: Job, fmt: str = "safetensors") -> Download | Pending:
    """The model in `fmt`, or Pending while a worker makes it (onnx, torchscript, hf)."""
    check_format(job, fmt)
    if not job.model_file:
        raise Conflict("No round has finished yet, so there is no model to download.")
    name = f"{job.pk}{SUFFIX[fmt]}"
    if fmt == "safetensors":
        return Download(files.get(job.model_file), name, "application/octet-stream")
    cached = export_name(job.pk, job.model_hash, fmt)
    content_type = "application/zip" if fmt == "hf" else "application/octet-stream"
    if default_storage.exists(cached):
        return Download(files.get(cached), name, content_type)
    if fmt == "pt2":  # the buyer's program with the trained weights: no torch needed
        from marketplace.jobs.model_files import program_name
        from trainer.exported.repack import with_weights

        data = with_weights(files.get(program_name(model_job(job).pk)), files.get(job.model_file))
        files.put(cached, data, content_addressed=True)
        return Download(data, name, content_type)
    # onnx, torchscript, hf: the model is built and traced with torch, by the worker
    record = request_export(job, fmt, cached)
    if default_storage.exists(cached):  # made already: a worker was quick, or runs eagerly
        return Download(files.get(cached), name, content_type)
    record.refresh_from_db(fields=["status", "error", "model_hash"])
    if record.status == ExportStatus.FAILED and record.model_hash == job.model_hash:
        raise BadFormat(f"format: {record.error}.", parameter="format")
    return Pending(fmt, job.model_hash, RETRY_AFTER_S)
