"""Writes for accounts: users and their API keys."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.accounts import keys
from marketplace.accounts.errors import KeyLimitReached
from marketplace.accounts.models import ApiKey, Role, User
from marketplace.accounts.selectors import user_keys


def create_user(username: str, role: str = Role.BUYER, email: str = "") -> User:
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(Role.values)}")
    user = User(username=username, email=email, role=role)
    user.set_unusable_password()  # API keys only; operators may set a password for admin
    user.full_clean(exclude=["password"])
    user.save()
    return user


@transaction.atomic
def issue_user_key(user: User, name: str = "") -> tuple[ApiKey, str]:
    """A new key for `user`, up to MAX_API_KEYS_PER_USER unrevoked ones; the plaintext is
    returned here and never stored."""
    limit = settings.GPUFLEX["MAX_API_KEYS_PER_USER"]
    # the user's row locked: two requests at once cannot both take the last place
    User.objects.select_for_update(no_key=True).filter(pk=user.pk).first()
    if user_keys(user).filter(revoked_at__isnull=True).count() >= limit:
        raise KeyLimitReached(
            f"You already have {limit} API keys, the most one account may hold; "
            "revoke one you no longer use to make another.",
            limit=limit,
        )
    plaintext = keys.new_key(keys.USER_PREFIX)
    key = ApiKey.objects.create(
        user=user, name=name, prefix=keys.display_prefix(plaintext), digest=keys.digest(plaintext)
    )
    return key, plaintext


def issue_node_key(node) -> tuple[ApiKey, str]:
    plaintext = keys.new_key(keys.NODE_PREFIX)
    key = ApiKey.objects.create(
        user=node.owner,
        node=node,
        name=f"node {node.name}",
        prefix=keys.display_prefix(plaintext),
        digest=keys.digest(plaintext),
    )
    return key, plaintext


@transaction.atomic
def revoke_key(key: ApiKey) -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key
