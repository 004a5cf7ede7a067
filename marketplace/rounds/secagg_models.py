"""A secure-aggregation round's server state (marketplace/rounds/secagg.py): the roster of
public keys, the shares sealed for each member (ciphertext the server cannot open), and the
shares the survivors reveal for unmasking. Never a plain update: a member's masked input is
its TaskResult's update file."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.db import models


class SecAggPhase(models.TextChoices):
    ADVERTISE = "advertise"  # nodes send their public keys
    SHARE = "share"  # the roster is fixed; nodes send their sealed shares
    MASK = "mask"  # U1 (who shared) is fixed; nodes upload masked inputs
    UNMASK = "unmask"  # U2 (survivors) is fixed; survivors reveal shares
    READY = "ready"  # enough shares: the aggregation unmasks the sum


class SecAggRound(models.Model):
    round = models.OneToOneField("rounds.Round", on_delete=models.CASCADE, related_name="secagg")
    phase = models.CharField(
        max_length=16, choices=SecAggPhase.choices, default=SecAggPhase.ADVERTISE
    )
    # when the phase goes on without the members that have not answered yet
    phase_deadline = models.DateTimeField()
    threshold = models.PositiveSmallIntegerField(default=0)
    # roster indices: who shared their keys (U1), and of those who uploaded (U2) or not
    shared = models.JSONField(default=list)
    survivors = models.JSONField(default=list)
    dropped = models.JSONField(default=list)


class SecAggMember(models.Model):
    """A task's node in the round: its public keys (hex) and, once fixed, its roster index."""

    secagg = models.ForeignKey(SecAggRound, on_delete=models.CASCADE, related_name="members")
    task = models.OneToOneField("rounds.Task", on_delete=models.CASCADE, related_name="+")
    index = models.PositiveSmallIntegerField(null=True, blank=True)
    c_key = models.CharField(max_length=64)
    s_key = models.CharField(max_length=64)
    # node index -> ["b" | "s", share hex]: what it revealed for unmasking; cleared once used
    revealed = models.JSONField(default=dict, blank=True)
    answered = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["secagg", "index"], name="secagg_unique_index"),
        ]


class SecAggShare(models.Model):
    """A pair of Shamir shares one member sealed (AES-GCM) for another."""

    secagg = models.ForeignKey(SecAggRound, on_delete=models.CASCADE, related_name="shares")
    sender = models.PositiveSmallIntegerField()
    recipient = models.PositiveSmallIntegerField()
    sealed = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["secagg", "sender", "recipient"], name="secagg_share_once"
            )
        ]
