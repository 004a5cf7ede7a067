"""Operator enrollment tokens for platform nodes: made, redeemed, revoked.

A platform node's results are trusted more than a volunteer's (spot-checked rather than
replicated until it is trusted), so only an operator makes one: with a token handed to the
machine that will register, or by changing a node's kind in the admin.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.nodes.errors import EnrollmentRequired
from marketplace.nodes.models import EnrollmentToken

TOKEN_PREFIX = "gfx_e_"
MAX_TOKEN_LENGTH = 100


def _digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def create_enrollment_token(
    *, operator: User | None, uses: int = 1, expires_in_s: float | None = None, memo: str = ""
) -> tuple[EnrollmentToken, str]:
    """A new token good for `uses` platform registrations; the plaintext is returned here and
    never stored. `operator` is None only on the command line (the machine's own operator)."""
    if operator is not None and not operator.is_operator:
        raise PermissionError("only operators enroll platform nodes")
    if uses < 1:
        raise ValueError("a token must allow at least one registration")
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires = timezone.now() + timedelta(seconds=expires_in_s) if expires_in_s else None
    token = EnrollmentToken.objects.create(
        digest=_digest(plaintext), prefix=plaintext[:12], created_by=operator, memo=memo,
        uses_left=uses, expires_at=expires,
    )  # fmt: skip
    return token, plaintext


def redeem_enrollment_token(plaintext: str | None) -> EnrollmentToken:
    """Use one registration of a valid token, within the caller's transaction (a failed
    registration rolls the use back); EnrollmentRequired names the field otherwise."""
    if not plaintext:
        raise EnrollmentRequired(
            "kind: a platform node needs an operator's enrollment token in 'enrollment_token'; "
            "register as 'volunteer', or ask an operator for a token.",
            field="enrollment_token",
        )
    usable = EnrollmentToken.objects.filter(
        digest=_digest(plaintext), uses_left__gt=0, revoked_at__isnull=True
    ).exclude(expires_at__lte=timezone.now())
    with transaction.atomic():
        token = usable.first()
        # a compare-and-set: of two registrations racing for a token's last use, one wins
        if token is None or not usable.filter(pk=token.pk).update(uses_left=F("uses_left") - 1):
            raise EnrollmentRequired(
                "enrollment_token: the token is unknown, used up, expired or revoked.",
                field="enrollment_token",
            )
    return token


def revoke_enrollment_token(token: EnrollmentToken) -> EnrollmentToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
