"""Upload sessions: create (quota first), write chunks in order, finish (size and sha256
checked, then the file moved into storage at once), use by a job, abort, expire.

Nothing is half-stored: a session's bytes live in its partial file (uploads/partial.py)
until `finish` has checked them; a wrong hash discards them; a stale session is removed
by the maintenance tick with its file.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, InvalidDataset, TooLarge
from marketplace.uploads import partial
from marketplace.uploads.errors import (
    BadChunk,
    ChunkOutOfOrder,
    HashMismatch,
    IncompleteUpload,
    OverQuota,
)
from marketplace.uploads.models import Upload, UploadStatus
from marketplace.uploads.selectors import quota_used, upload_of

log = logging.getLogger(__name__)

CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$", re.ASCII)
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _limits() -> dict[str, int]:
    g = settings.GPUFLEX
    return {
        "max_bytes": int(g["MAX_UPLOAD_BYTES"]),
        "quota": int(g["UPLOAD_QUOTA_BYTES"]),
        "max_chunk": int(g["MAX_UPLOAD_CHUNK_BYTES"]),
    }


def safe_filename(name: str) -> str:
    """The file's own name, without folders, in characters every storage takes."""
    base = Path(str(name).replace("\\", "/")).name
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[:100]
    return cleaned or "upload"


def create_upload(*, owner: User, filename: str, size: int, sha256: str) -> Upload:
    """A new session for a file of `size` bytes and hash `sha256`. Refused before any byte
    is sent when it is larger than one upload may be or than the owner's quota has left."""
    limits = _limits()
    sha256 = sha256.lower()
    if not SHA256.match(sha256):
        raise BadChunk("sha256 must be 64 hexadecimal digits (the file's SHA-256).")
    if size < 1:
        raise BadChunk("size must be at least 1 byte.")
    if size > limits["max_bytes"]:
        raise TooLarge(
            f"The file is {size} bytes; one upload may be at most {limits['max_bytes']} bytes."
        )
    with transaction.atomic():
        # one quota check at a time per account: two sessions opened at once cannot both
        # take the last of it
        User.objects.select_for_update(no_key=True).filter(pk=owner.pk).first()
        used = quota_used(owner)
        if used + size > limits["quota"]:
            raise OverQuota(
                f"This upload of {size} bytes would exceed your upload quota: {used} of "
                f"{limits['quota']} bytes are held by unfinished or unused uploads. Delete "
                "some (DELETE /api/v1/uploads/ID/) or submit jobs with them first.",
                used=used,
                quota=limits["quota"],
            )
        return Upload.objects.create(
            owner=owner, filename=safe_filename(filename), size=size, sha256=sha256
        )


def parse_content_range(header: str | None) -> tuple[int, int, int]:
    """`bytes START-END/TOTAL` (RFC 9110; END inclusive) as three integers."""
    match = CONTENT_RANGE.match((header or "").strip())
    if match is None:
        raise BadChunk(
            "A chunk needs a Content-Range header like 'bytes 0-1048575/5000000' (the first "
            "and last byte offsets of the chunk, inclusive, and the file's total size)."
        )
    start, end, total = (int(g) for g in match.groups())
    if end < start:
        raise BadChunk(f"Content-Range ends at byte {end}, before its start {start}.")
    return start, end, total


def write_chunk(
    *,
    owner: User,
    upload_id: object,
    content_range: str | None,
    content_length: int | None,
    stream: BinaryIO | None,
) -> Upload:
    """Append the chunk `content_range` names, read from `stream`. It must start exactly
    where the upload stands (`received`): a chunk out of order, or overlapping bytes already
    received, is refused with that offset (409), and nothing of it is written."""
    start, end, total = parse_content_range(content_range)
    count = end - start + 1
    max_chunk = _limits()["max_chunk"]
    if count > max_chunk:
        raise TooLarge(f"The chunk is {count} bytes; a chunk may be at most {max_chunk} bytes.")
    if content_length is not None and content_length != count:
        raise BadChunk(f"The body is {content_length} bytes but Content-Range spans {count} bytes.")
    with transaction.atomic():
        upload = _write_chunk(owner, upload_id, start, end, total, stream)
    if upload is None:  # its bytes went missing on the server (a wiped upload folder)
        with transaction.atomic():
            _discard(upload_of(owner, upload_id, lock=True))
        raise Conflict(f"Upload {upload_id} lost its received bytes on the server; start a "
                       "new upload.")  # fmt: skip
    if start == 0 and (problem := head_problem(upload)) is not None:
        # refused from its first chunk, not after gigabytes: the session and its bytes go now
        with transaction.atomic():
            _discard(upload_of(owner, upload_id, lock=True))
        raise InvalidDataset(
            f"The upload was refused at its first chunk and its bytes removed: {problem}. "
            "Fix the file and upload it again."
        )
    return upload


# how much of a file's start the early format check reads (far more than a CSV field may be)
HEAD_BYTES = 4 * 2**20


def head_problem(upload: Upload) -> str | None:
    """What the start of the upload's file already shows is wrong, for the formats whose
    start says something on its own (CSV: the text, the header, the field size, the rows'
    widths); None for the others, checked whole when a job uses the file."""
    from trainer.datasets.base import DatasetError
    from trainer.datasets.csv_rows import check_csv_head

    if not upload.filename.lower().endswith(".csv"):
        return None
    path = partial.partial_path(upload.pk)
    with path.open("rb") as fh:
        head = fh.read(HEAD_BYTES)
    whole = upload.received >= upload.size and len(head) == upload.size
    try:
        check_csv_head(head, whole, upload.filename)
    except DatasetError as exc:
        return str(exc)
    return None


def _write_chunk(
    owner: User, upload_id: object, start: int, end: int, total: int, stream: BinaryIO | None
) -> Upload | None:
    # the row lock makes one chunk of a session write at a time
    upload = upload_of(owner, upload_id, lock=True)
    if upload.status != UploadStatus.OPEN:
        raise Conflict(f"Upload {upload.pk} is {upload.status}; it takes no more chunks.")
    if total != upload.size:
        raise BadChunk(
            f"Content-Range gives the total as {total} bytes; the upload declared "
            f"{upload.size} bytes."
        )
    if end >= upload.size:
        raise BadChunk(f"The chunk ends at byte {end}, past the file's last byte "
                       f"{upload.size - 1}.")  # fmt: skip
    if start != upload.received:
        what = "overlaps bytes already received" if start < upload.received else "skips bytes"
        raise ChunkOutOfOrder(
            f"The chunk starts at byte {start} and {what}: the upload has "
            f"{upload.received} bytes; send the chunk that starts at byte {upload.received}.",
            received=upload.received,
        )
    path = partial.partial_path(upload.pk)
    if partial.current_size(path) < upload.received:
        return None
    if stream is None:
        raise BadChunk("The chunk has no body.")
    count = end - start + 1
    written = partial.write_at(path, start, stream, count)
    if written != count:
        raise BadChunk(
            f"The chunk ended after {written} of its {count} bytes; none of it was kept. "
            f"Send it again from byte {upload.received}.",
            received=upload.received,
        )
    upload.received = end + 1
    upload.save(update_fields=["received", "updated_at"])
    return upload


def stored_name(upload: Upload) -> str:
    return f"uploads/{upload.owner_id}/{upload.pk}/{upload.filename}"


def finish_upload(*, owner: User, upload_id: object) -> Upload:
    """Check the received file against the declared size and sha256 and move it into the
    storage backend. Missing bytes: 400 naming where to resume, the session kept. A wrong
    hash: 400, and the session and its bytes are discarded (they are not the file). Finishing
    a finished upload again answers it as it is (a retry after a lost answer)."""
    mismatch: tuple[Upload, str] | None = None
    with transaction.atomic():
        upload = upload_of(owner, upload_id, lock=True)
        if upload.status == UploadStatus.COMPLETE:
            return upload
        if upload.status != UploadStatus.OPEN:
            raise Conflict(f"Upload {upload.pk} is {upload.status}; it cannot be finished.")
        if upload.received < upload.size:
            raise IncompleteUpload(
                f"The upload has {upload.received} of its {upload.size} bytes: "
                f"{upload.size - upload.received} bytes are missing. Send them from byte "
                f"{upload.received} and finish again.",
                received=upload.received,
            )
        path = partial.partial_path(upload.pk)
        digest = partial.sha256_of(path) if path.is_file() else ""
        if partial.current_size(path) != upload.size or digest != upload.sha256:
            mismatch = (upload, digest)
        else:
            name = stored_name(upload)
            try:
                files.put_file(name, path, move=True)
                upload.status, upload.stored_name = UploadStatus.COMPLETE, name
                upload.completed_at = timezone.now()
                upload.save(update_fields=["status", "stored_name", "completed_at",
                                           "updated_at"])  # fmt: skip
            except BaseException:
                files.delete_tree([name])
                raise
    if mismatch is not None:
        upload, digest = mismatch
        with transaction.atomic():
            _discard(upload)
        raise HashMismatch(
            f"The received file's sha256 is {digest or 'unknown (its bytes are lost)'}, not "
            f"the declared {upload.sha256}; the upload was discarded. Upload the file again."
        )
    return upload


def abort_upload(*, owner: User, upload_id: object) -> None:
    with transaction.atomic():
        _discard(upload_of(owner, upload_id, lock=True))


def _discard(upload: Upload) -> None:
    """Delete the session and its bytes (the partial file at once, the stored file once
    the deletion commits)."""
    partial.remove(partial.partial_path(upload.pk))
    name = upload.stored_name
    if name:
        transaction.on_commit(lambda: files.delete_tree([name]))
    upload.delete()


def dataset_upload(owner: User, upload_id: object) -> Upload:
    """A finished upload of the owner's that a job may take as its dataset."""
    upload = upload_of(owner, upload_id)
    if upload.status == UploadStatus.OPEN:
        raise InvalidDataset(
            f"Upload {upload.pk} is not finished ({upload.received} of {upload.size} bytes); "
            "finish it before submitting the job."
        )
    if upload.status != UploadStatus.COMPLETE:
        raise InvalidDataset(f"Upload {upload.pk} was used by a job already; upload it again.")
    return upload


def use_upload(upload: Upload, job_id: object) -> None:
    """Inside the job's transaction: the job took its own copy of the file, so the upload
    is marked used (it counts against the quota no more) and its file goes on commit.
    Raced by another submission of the same upload: a 409, and the job is not stored."""
    locked = Upload.objects.select_for_update(no_key=True).get(pk=upload.pk)
    if locked.status != UploadStatus.COMPLETE:
        raise Conflict(f"Upload {upload.pk} was used by another job meanwhile.")
    name = locked.stored_name
    Upload.objects.filter(pk=upload.pk).update(
        status=UploadStatus.USED, stored_name="", job_id=job_id, updated_at=timezone.now()
    )
    transaction.on_commit(lambda: files.delete_tree([name]))


def expire_stale_uploads(at: datetime | None = None) -> int:
    """The maintenance tick's part: open sessions without a chunk for UPLOAD_STALE_S, and
    finished uploads no job took within UPLOAD_KEEP_S, go with their bytes; so do partial
    files no session owns (a crash between writing and recording)."""
    g = settings.GPUFLEX
    at = at or timezone.now()
    stale = Upload.objects.filter(
        status=UploadStatus.OPEN, updated_at__lt=at - timedelta(seconds=g["UPLOAD_STALE_S"])
    ) | Upload.objects.filter(
        status=UploadStatus.COMPLETE, completed_at__lt=at - timedelta(seconds=g["UPLOAD_KEEP_S"])
    )
    removed = 0
    for upload_id in list(stale.values_list("pk", flat=True)):
        with transaction.atomic():
            upload = Upload.objects.select_for_update(skip_locked=True).filter(pk=upload_id)
            row = upload.first()
            if row is None:
                continue  # a chunk is being written to it right now, or it went meanwhile
            _discard(row)
            removed += 1
    removed += _orphan_partials(at.timestamp() - g["UPLOAD_STALE_S"])
    if removed:
        log.info("removed %d stale upload(s)", removed)
    return removed


def _orphan_partials(before: float) -> int:
    """Partial files older than `before` (a timestamp) that no upload owns. Only old files
    are looked up, so a folder of busy uploads costs the tick a listing, not a query."""
    folder = partial.upload_dir()
    if not folder.is_dir():
        return 0
    old = {}
    for path in folder.glob("*.part"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < before:
                old[path.stem] = path
    if not old:
        return 0
    ids = Upload.objects.filter(pk__in=_uuids(old)).values_list("pk", flat=True)
    known = {str(pk) for pk in ids}
    for stem, path in old.items():
        if stem not in known:
            partial.remove(path)
    return len(old) - len(known & set(old))


def _uuids(found: dict[str, Path]) -> list[str]:
    out = []
    for stem in found:
        try:
            out.append(str(uuid.UUID(stem)))
        except ValueError:
            continue
    return out
