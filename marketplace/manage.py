"""Django's manage.py for the marketplace (also reachable as `gpuflex manage`)."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")
    from marketplace.server.settings.environment import SettingsError, check

    try:  # a bad setting is a message naming it, not the settings module's traceback
        check()
    except SettingsError as exc:
        print(
            "settings refused (docs/settings.md):\n  " + "\n  ".join(exc.problems), file=sys.stderr
        )
        sys.exit(2)
    from django.core.management import execute_from_command_line

    execute_from_command_line(argv if argv is not None else sys.argv)


if __name__ == "__main__":
    main()
