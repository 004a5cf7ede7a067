"""`gpuflex manage create_enrollment_token --uses 3`: a platform enrollment token, printed
once (docs/operations.md, "Platform nodes")."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser

from marketplace.nodes.enrollment import create_enrollment_token


class Command(BaseCommand):
    help = "Print a new token that enrolls platform nodes (shown only this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--uses", type=int, default=1, help="registrations it allows")
        parser.add_argument("--expires-in", type=int, default=None, help="seconds; default never")
        parser.add_argument("--memo", default="", help="what it is for, for the admin")

    def handle(self, *args: object, **options: object) -> None:
        _, plaintext = create_enrollment_token(
            operator=None, uses=int(options["uses"]), expires_in_s=options["expires_in"],
            memo=str(options["memo"]),
        )  # fmt: skip
        self.stdout.write(plaintext)
