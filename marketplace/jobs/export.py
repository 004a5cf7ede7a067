"""A job's latest model in a download format (trainer/export.py), for the API and the web page.

`safetensors` is the stored file itself (unchanged, so its hash header still holds); the
others are made on first request and kept beside the job's models, named by the model's hash,
so a second download (or another web server) finds them instead of exporting again.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.files.storage import default_storage

from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError
from marketplace.jobs.models import Job
from trainer.export_formats import FORMATS, hf_refusal


class BadFormat(MarketplaceError):
    """A format this job's model cannot be exported to: a 400 naming the parameter."""

    code = "invalid_format"


@dataclass(frozen=True)
class Download:
    data: bytes
    filename: str
    content_type: str


SUFFIX = {"safetensors": ".safetensors", "torchscript": ".torchscript.pt", "onnx": ".onnx",
          "hf": ".hf.zip", "pt2": ".pt2"}  # fmt: skip
# an exported model (model.arch: exported) is the buyer's program: it goes back as that
# program with the trained weights (trainer/exported/repack.py), or as its weights
PROGRAM_FORMATS = ("safetensors", "pt2")


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


def job_model_download(job: Job, fmt: str = "safetensors") -> Download:
    check_format(job, fmt)
    if not job.model_file:
        raise Conflict("No round has finished yet, so there is no model to download.")
    name = f"{job.pk}{SUFFIX[fmt]}"
    if fmt == "safetensors":
        return Download(files.get(job.model_file), name, "application/octet-stream")
    cached = f"{files.job_dir(job.id)}/exports/{job.model_hash}{SUFFIX[fmt]}"
    content_type = "application/zip" if fmt == "hf" else "application/octet-stream"
    if default_storage.exists(cached):
        return Download(files.get(cached), name, content_type)
    if fmt == "pt2":  # the buyer's program with the trained weights: no torch needed
        from marketplace.jobs.model_files import program_name
        from trainer.exported.repack import with_weights

        data = with_weights(files.get(program_name(model_job(job).pk)), files.get(job.model_file))
        files.put(cached, data, content_addressed=True)
        return Download(data, name, content_type)
    # onnx, torchscript, hf: the model is built and traced (torch); a safetensors or pt2
    # download, the common case, keeps the web process torch-free (issue 36)
    from trainer.export import ExportError, TrainedModel, export_model

    model = TrainedModel.from_bytes(files.get(job.model_file), model_job(job).parsed_spec.model)
    try:
        exported = export_model(model, fmt)
    except ExportError as exc:
        raise BadFormat(f"format: {exc}.", parameter="format") from None
    files.put(cached, exported.data, content_addressed=True)
    return Download(exported.data, name, exported.content_type)
