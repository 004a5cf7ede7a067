"""A job's model files from the buyer: a Hugging Face config.json and a safetensors checkpoint.

The config is small and goes into the stored spec inline, so every node builds the model from
the spec alone. The checkpoint is checked in the request on the meta device (its header only:
names, shapes and dtypes against the model, nothing loaded), stored with the job, and loaded
by the worker that builds round 1's model (jobs/preparation.py); nodes never get it on its own,
only the round's model built from it. Safetensors only: nothing the buyer sends is unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.core.files.uploadedfile import UploadedFile

from marketplace.jobs import files
from marketplace.jobs.errors import InvalidSpec, TooLarge
from trainer.nesting import TooDeep, loads_json
from trainer.spec import MAX_HF_CONFIG_BYTES, JobSpec, SpecError

# not "checkpoint.safetensors": that name is the aggregation's resume checkpoint
CHECKPOINT_FILE = "initial-weights.safetensors"
PROGRAM_FILE = "program.pt2"


def checkpoint_name(job_id: object) -> str:
    return f"{files.job_dir(job_id)}/{CHECKPOINT_FILE}"


def program_name(job_id: object) -> str:
    """An exported model's program (model.arch: exported), as the buyer uploaded it."""
    return f"{files.job_dir(job_id)}/{PROGRAM_FILE}"


def _invalid(field: str, reason: str) -> InvalidSpec:
    return InvalidSpec(
        f"The job spec is invalid: {field}: {reason}.",
        problems=[{"field": field, "reason": reason}],
    )


@dataclass(frozen=True)
class ModelFiles:
    spec: JobSpec  # the config inline; the checkpoint named as the buyer named it
    checkpoint: Path | None  # the upload in the request's temporary folder
    program: Path | None = None  # an exported model's .pt2, there too, passed by the gate


def receive_model_files(
    spec: JobSpec,
    config: UploadedFile | None,
    checkpoint: UploadedFile | None,
    tmp: Path,
    max_checkpoint_bytes: int,
    program: UploadedFile | None = None,
) -> ModelFiles:
    """The spec with the uploaded config.json inlined and the checkpoint written to `tmp`;
    a file the spec names but the request lacks (or the other way round) is a 400."""
    model = spec.model
    changes: dict[str, object] = {}
    if config is not None:
        if model.config is None:
            raise _invalid(
                "model.config", f"a config.json is for the hf_* archs, not {model.arch!r}"
            )
        changes["config"] = _read_config(config)
    elif isinstance(model.config, str):
        raise _invalid(
            "model.config",
            f"it names the file {model.config!r}: upload it as 'model_config', or give the "
            "config inline",
        )
    path = None
    if checkpoint is not None:
        if checkpoint.size is not None and checkpoint.size > max_checkpoint_bytes:
            raise TooLarge(
                f"The model checkpoint is {checkpoint.size} bytes; this job's model cap allows "
                f"{max_checkpoint_bytes} bytes."
            )
        path = tmp / CHECKPOINT_FILE
        with path.open("wb") as out:
            for chunk in checkpoint.chunks():
                out.write(chunk)
        changes["checkpoint"] = Path(checkpoint.name or CHECKPOINT_FILE).name
    elif model.checkpoint is not None:
        raise _invalid(
            "model.checkpoint",
            f"it names the file {model.checkpoint!r}: upload it as 'model_checkpoint'",
        )
    program_path = None
    if program is not None:
        program_path = _receive_program(program, tmp, max_checkpoint_bytes)
        changes["program"] = Path(program.name or PROGRAM_FILE).name
    elif model.program is not None:
        raise _invalid(
            "model.program",
            f"it names the file {model.program!r}: upload it as 'model_program'",
        )
    if not changes:
        return ModelFiles(spec, None)
    try:
        return ModelFiles(spec.replace(model={**spec.model.model_dump(mode="json"), **changes}),
                          path, program_path)  # fmt: skip
    except SpecError as exc:
        field, reason = exc.problems[0]
        raise _invalid(field, reason) from None


def _receive_program(upload: UploadedFile, tmp: Path, max_bytes: int) -> Path:
    """The .pt2 written to `tmp` once the gate has read it (standard library only: JSON and
    raw bytes, nothing unpickled, no torch in the request); a refusal is a 400 naming the
    member, operator or limit, and nothing is stored."""
    from trainer.exported.archive import ArchiveError, read_archive
    from trainer.exported.gate import GateError, check_program

    if upload.size is not None and upload.size > max_bytes:
        raise TooLarge(f"The model program is {upload.size} bytes; this job's model cap allows "
                       f"{max_bytes} bytes.")  # fmt: skip
    path = tmp / PROGRAM_FILE
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    try:
        check_program(read_archive(path, max_bytes))
    except (ArchiveError, GateError) as exc:
        raise _invalid("model.program", str(exc)) from None
    return path


def _read_config(upload: UploadedFile) -> dict:
    if upload.size is not None and upload.size > MAX_HF_CONFIG_BYTES:
        raise _invalid("model.config", f"config.json is larger than {MAX_HF_CONFIG_BYTES} bytes")
    raw = b"".join(upload.chunks())[: MAX_HF_CONFIG_BYTES + 1]
    try:
        data = loads_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, TooDeep) as exc:
        raise _invalid("model.config", f"config.json is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _invalid("model.config", "config.json holds a JSON object")
    return data
