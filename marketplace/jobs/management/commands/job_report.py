"""`gpuflex manage job_report JOB`: a job's outcome and the checks that it went right."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marketplace.jobs.models import Job


class Command(BaseCommand):
    help = (
        "Accuracy per round, per-node work and earnings, the buyer's bill, and whether the "
        "ledger reconciles, the provenance verifies and no update was counted twice (JSON)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="the job's id")

    def handle(self, *args: Any, **options: Any) -> None:
        from marketplace.demo.summary import summarize

        if not Job.objects.filter(pk=options["job"]).exists():
            raise CommandError(f"no job {options['job']}")
        self.stdout.write(json.dumps(summarize(options["job"], {})))
