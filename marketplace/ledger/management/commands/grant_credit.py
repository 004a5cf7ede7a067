"""`gpuflex manage grant_credit USER AMOUNT`: an operator adds credit to a buyer."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marketplace.accounts.models import User
from marketplace.ledger.errors import LedgerError
from marketplace.ledger.selectors import balances
from marketplace.ledger.services import grant_credit


class Command(BaseCommand):
    help = "Add credit to a user's balance (an operator grant)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("amount", help="credits, a decimal such as 25.00")
        parser.add_argument("--memo", default="operator grant")
        parser.add_argument("--key", default="", help="idempotency key: a rerun grants once")

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user is called {options['username']!r}")
        try:
            grant_credit(
                user=user,
                amount=options["amount"],
                memo=options["memo"],
                operator=None,
                key=f"grant:cli:{options['key']}" if options["key"] else "",
            )
        except LedgerError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"{user.username} now has {balances(user).available} available")
