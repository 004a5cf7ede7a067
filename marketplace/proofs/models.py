"""A segment check of one uploaded result (services.py says how it runs)."""

from __future__ import annotations

from django.db import models


class CheckStatus(models.TextChoices):
    REQUESTED = "requested"  # the node has been asked to reveal its checkpoints
    REVEALED = "revealed"  # all revealed and matching their commitments: re-run pending
    PASSED = "passed"
    FAILED = "failed"
    # the verifier could not re-run it (a model it cannot build here): no verdict either way
    SKIPPED = "skipped"


class SegmentCheck(models.Model):
    result = models.OneToOneField(
        "rounds.TaskResult", on_delete=models.CASCADE, related_name="segment_check"
    )
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="segment_checks")
    # the upload's claim: the boundaries' step counts and the commitments to their states
    boundaries = models.JSONField()
    commitments = models.JSONField()
    segment = models.PositiveSmallIntegerField(help_text="j: steps boundaries[j]..[j+1]")
    # the boundaries the node must reveal: 0, j, j+1 and the last (binding to model and update)
    wanted = models.JSONField()
    revealed = models.JSONField(default=dict, help_text="step -> stored checkpoint file")
    status = models.CharField(
        max_length=12, choices=CheckStatus.choices, default=CheckStatus.REQUESTED
    )
    deadline = models.DateTimeField(help_text="reveal by then, or fail the check")
    distance = models.FloatField(null=True, blank=True, help_text="segment relative L2")
    tolerance = models.FloatField(null=True, blank=True)
    # verification compute against useful compute: steps re-run / the task's steps
    rerun_steps = models.PositiveIntegerField(default=0)
    task_steps = models.PositiveIntegerField(default=0)
    verifier = models.CharField(max_length=40, blank=True, default="", help_text="who re-ran")
    reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = (
            models.Index(fields=["node", "status"]),
            models.Index(fields=["status", "deadline"]),
        )
