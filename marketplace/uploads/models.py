"""Chunked, resumable uploads of large files (datasets): one session per file.

A session declares the file's size and sha256 up front; chunks arrive in order at the
offset the session has reached (`received`), are written to a partial file on the server's
disk, and `finish` checks size and hash before moving the file into the storage backend.
"""

# ruff: noqa: RUF012 - Django declares Meta options as class attributes

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class UploadStatus(models.TextChoices):
    OPEN = "open"  # receiving chunks; its bytes are in the partial file
    COMPLETE = "complete"  # checked and stored under `stored_name`; not used by a job yet
    USED = "used"  # a job took its file (the job keeps its own copy); counts no more


class Upload(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="uploads"
    )
    filename = models.CharField(max_length=255, help_text="the file's own name, no folders")
    size = models.BigIntegerField(help_text="the declared size in bytes")
    sha256 = models.CharField(max_length=64, help_text="the declared sha256, lowercase hex")
    received = models.BigIntegerField(default=0, help_text="bytes written, all from offset 0")
    status = models.CharField(max_length=16, choices=UploadStatus.choices,
                              default=UploadStatus.OPEN)  # fmt: skip
    stored_name = models.CharField(max_length=300, blank=True, default="")
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="uploads"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, help_text="the last chunk or change")
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "status"], name="upload_owner_status"),
            models.Index(fields=["status", "updated_at"], name="upload_status_updated"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(received__gte=0) & models.Q(received__lte=models.F("size")),
                name="upload_received_within_size",
            )
        ]

    def __str__(self) -> str:
        return f"{self.filename} ({self.received}/{self.size} bytes, {self.status})"
