"""Users with a role, and the API keys they (and their nodes) authenticate with."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models


class Role(models.TextChoices):
    BUYER = "buyer"
    PROVIDER = "provider"
    OPERATOR = "operator"


class User(AbstractUser):
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.BUYER)

    @property
    def is_operator(self) -> bool:
        return self.role == Role.OPERATOR


class ApiKey(models.Model):
    """A bearer key, stored as its sha256 only: the plaintext is shown once, at creation.

    sha256 rather than a slow password hash: keys are 32 random bytes, so there is nothing
    to brute-force, and every request must look one up fast. A key with a `node` is that
    node's credential (prefix gfx_n_), otherwise its user's (gfx_u_).
    """

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_keys")
    node = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="keys"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, help_text="first characters, to recognise a key")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "revoked_at"])]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_node_key(self) -> bool:
        return self.node_id is not None
