"""`gpuflex manage reconcile`: prove the ledger's invariants; exit status 1 if any fails."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marketplace.ledger.reconcile import reconcile


class Command(BaseCommand):
    help = "Check the ledger: zero sums, no negative balances, escrow, charges, payouts, chain."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--no-chain", action="store_true", help="skip the contract checks")

    def handle(self, *args: Any, **options: Any) -> None:
        report = reconcile(with_chain=not options["no_chain"])
        if options["json"]:
            self.stdout.write(json.dumps(report.to_dict()))
        else:
            for name in report.checked:
                self.stdout.write(f"checked: {name}")
            for problem in report.problems:
                self.stdout.write(self.style.ERROR(f"problem: {problem}"))
            if report.ok:
                self.stdout.write(self.style.SUCCESS("the ledger reconciles"))
        if not report.ok:
            raise CommandError(f"{len(report.problems)} problem(s) found", returncode=1)
