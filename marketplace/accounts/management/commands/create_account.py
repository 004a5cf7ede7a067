"""`gpuflex manage create_account NAME --role buyer`: a user and one API key, printed once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marketplace.accounts.models import Role
from marketplace.accounts.services import create_user, issue_user_key


class Command(BaseCommand):
    help = "Create a user with a role and print a new API key (shown only this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", choices=Role.values, default=Role.BUYER)
        parser.add_argument("--email", default="")

    def handle(self, *args: object, **options: str) -> None:
        try:
            user = create_user(options["username"], options["role"], options["email"])
        except Exception as exc:  # validation errors from full_clean name the field
            raise CommandError(f"cannot create {options['username']!r}: {exc}") from None
        _, plaintext = issue_user_key(user, name="created by create_account")
        self.stdout.write(plaintext)
