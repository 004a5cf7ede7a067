"""Writes for accounts: users and their API keys."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from marketplace.accounts import keys
from marketplace.accounts.models import ApiKey, Role, User


def create_user(username: str, role: str = Role.BUYER, email: str = "") -> User:
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(Role.values)}")
    user = User(username=username, email=email, role=role)
    user.set_unusable_password()  # API keys only; operators may set a password for admin
    user.full_clean(exclude=["password"])
    user.save()
    return user


def issue_user_key(user: User, name: str = "") -> tuple[ApiKey, str]:
    """A new key for `user`; the plaintext is returned here and never stored."""
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
