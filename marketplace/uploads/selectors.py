"""Reading uploads: an owner's own only (another's is a 404, as for jobs)."""

from __future__ import annotations

import uuid

from django.core.exceptions import ValidationError
from django.db.models import QuerySet, Sum

from marketplace.accounts.models import User
from marketplace.jobs.errors import NotFound
from marketplace.uploads.models import Upload, UploadStatus

# what counts against an account's quota: bytes held for it that no job has taken yet
HELD = (UploadStatus.OPEN, UploadStatus.COMPLETE)


def uploads_of(owner: User) -> QuerySet[Upload]:
    return Upload.objects.filter(owner=owner)


def upload_of(owner: User, upload_id: object, *, lock: bool = False) -> Upload:
    qs = uploads_of(owner)
    if lock:
        qs = qs.select_for_update(no_key=True)
    try:
        return qs.get(pk=uuid.UUID(str(upload_id)))
    except (Upload.DoesNotExist, ValueError, ValidationError):
        raise NotFound(f"No upload {upload_id} exists or it is not yours.") from None


def quota_used(owner: User) -> int:
    """Declared bytes of the owner's open and finished, not yet used, uploads."""
    total = uploads_of(owner).filter(status__in=HELD).aggregate(total=Sum("size"))["total"]
    return int(total or 0)
