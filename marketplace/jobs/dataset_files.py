"""A job's dataset file from the buyer, checked whole before anything is stored.

`load_uploaded_dataset` takes the path of the assembled file (one multipart upload today;
a chunked upload assembles the file first and calls it the same way), so every way in runs
the same checks: the name's suffix picks the format, image archives are listed and checked
for traversal, links and bombs before an image is decoded (trainer/datasets/archives.py),
and text must be UTF-8 (JSONL: a "text" field per line). A problem is an InvalidDataset
(400) naming it, a size limit a TooLarge (413). Nothing here writes to storage.

Image archives are stored as uploaded, not converted: the server re-loads a job's dataset
through trainer.datasets.load_dataset for evaluation and re-cuts (jobs/datasets.py), the
same reader `gpuflex-sim` uses on the same archive, so both get identical tensors; nodes get
their shards as safetensors of the decoded images, like every other kind (rounds/resharding).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile

from marketplace.jobs import files
from marketplace.jobs.errors import InvalidDataset, InvalidSpec, TooLarge
from trainer.datasets.errors import ARCHIVE_SUFFIXES
from trainer.spec import JobSpec

if TYPE_CHECKING:
    from trainer.datasets import ArchiveLimits, Dataset

# the suffixes each uploaded kind is stored under; the upload's own name picks one
SUFFIXES: dict[str, tuple[str, ...]] = {
    "csv": (".csv",),
    "npz": (".npz",),
    "parquet": (".parquet",),
    "image_folder": ARCHIVE_SUFFIXES,
    "text": (".txt", ".jsonl"),
}
TOKENIZER_FILE = "tokenizer.json"


def tokenizer_name(job_id: object) -> str:
    return f"{files.job_dir(job_id)}/{TOKENIZER_FILE}"


def archive_limits() -> ArchiveLimits:
    from trainer.datasets import ArchiveLimits

    return ArchiveLimits(**settings.GPUFLEX["IMAGE_ARCHIVE"])


def stored_name(kind: str, upload_name: str) -> str:
    """`dataset<suffix>`: the suffix the format is read by, from the buyer's file name."""
    from trainer.datasets.errors import archive_suffix

    lower = upload_name.lower()
    if kind == "image_folder":
        suffix = archive_suffix(lower)
        if suffix is None:
            raise InvalidDataset(
                f"An image dataset is uploaded as one archive of class folders "
                f"({', '.join(ARCHIVE_SUFFIXES)}); {upload_name!r} is none of these."
            )
        return f"dataset{suffix}"
    if kind == "text":
        return "dataset.jsonl" if lower.endswith(".jsonl") else "dataset.txt"
    return f"dataset{SUFFIXES[kind][0]}"


def load_uploaded_dataset(
    spec: JobSpec, path: Path, shown: str, tokenizer: Path | None = None
) -> Dataset:
    """The dataset in the file at `path`, which the buyer named `shown` (its suffix says the
    format: stored_name), checked whole; `tokenizer`: the uploaded tokenizer.json of a text
    job that names one. Any file name will do for `path` (a chunked upload's assembled part
    file): the reader sees it under stored_name, through a link."""
    from trainer.datasets import ArchiveTooLarge, DatasetError, load_dataset

    wanted = stored_name(spec.dataset.kind, shown) if spec.dataset.kind in SUFFIXES else path.name
    with tempfile.TemporaryDirectory(prefix="gpuflex-dataset-") as tmp:
        if path.name != wanted:
            link = Path(tmp) / wanted
            link.symlink_to(path.resolve())
            path = link
        local = spec.dataset.model_copy(
            update={"path": str(path), "tokenizer": str(tokenizer) if tokenizer else None}
        )
        try:
            return load_dataset(local, seed=spec.seed, archive_limits=archive_limits())
        except ArchiveTooLarge as exc:
            raise TooLarge(f"The dataset is refused: {_named(exc, path, shown)}") from None
        except DatasetError as exc:
            message = _named(exc, path, shown)
            raise InvalidDataset(f"The dataset cannot be used: {message}") from None


def check_dataset_file(spec: JobSpec, path: Path, shown: str) -> None:
    """What a web request checks of an uploaded dataset without numpy, PIL or torch (issue
    36), with the loaders' own rules and messages: a CSV's every value (trainer/datasets/
    csv_rows.py), an image archive's listing (traversal, links, bombs, layout: archive_
    listing.py), a text corpus's UTF-8 and JSONL lines (corpus.py), an NPZ being a zip
    archive. The worker that prepares the job loads it whole
    (jobs/worker_checks.py) and fails the job with any other problem, its escrow released."""
    import zipfile

    from trainer.datasets.archive_listing import check_image_archive
    from trainer.datasets.corpus import documents
    from trainer.datasets.csv_rows import check_csv_values
    from trainer.datasets.errors import ArchiveTooLarge, DatasetError

    kind = spec.dataset.kind
    wanted = stored_name(kind, shown)  # an image archive of no known format: by its name
    with tempfile.TemporaryDirectory(prefix="gpuflex-dataset-") as tmp:
        if path.name != wanted:  # a chunked upload's part file: seen under its format's name
            link = Path(tmp) / wanted
            link.symlink_to(path.resolve())
            path = link
        try:
            if kind == "csv":
                check_csv_values(path, spec.dataset.label_column, shown)
            elif kind == "image_folder":
                check_image_archive(path, archive_limits())
            elif kind == "text":
                documents(path)
            elif kind == "npz" and not zipfile.is_zipfile(path):
                raise DatasetError(f"{shown}: cannot read NPZ: it is not a zip archive")
        except ArchiveTooLarge as exc:
            raise TooLarge(f"The dataset is refused: {_named(exc, path, shown)}") from None
        except DatasetError as exc:
            message = _named(exc, path, shown)
            raise InvalidDataset(f"The dataset cannot be used: {message}") from None


def _named(exc: Exception, path: Path, shown: str) -> str:
    # messages name our temporary path; the buyer knows the file by its own name
    return str(exc).replace(str(path), shown).replace(path.name, shown)


def receive_tokenizer(spec: JobSpec, upload: UploadedFile | None, tmp: Path) -> Path | None:
    """The uploaded tokenizer.json written to `tmp`, when the spec names one; a file the spec
    names but the request lacks (or the other way round) is a 400. Read later as JSON only
    (trainer/datasets/tokenizer.py)."""
    from trainer.datasets.tokenizer import MAX_TOKENIZER_BYTES

    named = spec.dataset.tokenizer
    if upload is None:
        if named is not None:
            raise _invalid(
                "dataset.tokenizer",
                f"it names the file {named!r}: upload it as 'dataset_tokenizer'",
            )
        return None
    if spec.dataset.kind != "text":
        raise _invalid(
            "dataset.tokenizer", f"a tokenizer is for text datasets, not {spec.dataset.kind!r}"
        )
    if named is None:
        raise _invalid(
            "dataset.tokenizer", "a tokenizer was uploaded but the spec names none: set it"
        )
    if upload.size is not None and upload.size > MAX_TOKENIZER_BYTES:
        raise TooLarge(
            f"The tokenizer is {upload.size} bytes; the limit is {MAX_TOKENIZER_BYTES} bytes."
        )
    path = tmp / TOKENIZER_FILE
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    return path


def _invalid(field: str, reason: str) -> InvalidSpec:
    return InvalidSpec(
        f"The job spec is invalid: {field}: {reason}.",
        problems=[{"field": field, "reason": reason}],
    )
