"""A sweep's trials: one row per child training job, the one record of the search.

trainer.sweep rebuilds an in-memory Optuna study from these rows for every decision (the
next trial's parameters, whether to prune one); no Optuna storage exists beside them.
"""

# ruff: noqa: RUF012 - Django declares Meta options as class attributes

from __future__ import annotations

from django.db import models

from marketplace.jobs.models import Job


class TrialState(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"
    PRUNED = "pruned"  # the median pruner stopped it; it paid only for its rounds
    FAILED = "failed"  # its job failed, was cancelled, stopped for budget, or never started


class SweepTrial(models.Model):
    sweep = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="trials")
    # the trial's training job (None when its spec could not be submitted: `error` says why)
    job = models.OneToOneField(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="sweep_trial"
    )
    number = models.PositiveIntegerField()
    # Optuna's parameters by the space's names (a layer list as its JSON text)
    params = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=TrialState.choices, default=TrialState.RUNNING)
    # round number (as text: JSON keys) -> the objective's per-round value (trainer.sweep)
    intermediate = models.JSONField(default=dict, blank=True)
    value = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["number"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "number"], name="sweep_trial_unique_number")
        ]

    def __str__(self) -> str:
        return f"trial {self.number} of {self.sweep_id} ({self.state})"
