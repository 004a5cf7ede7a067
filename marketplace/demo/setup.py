"""The demo's database, made in a process of its own: the migrations, its people (accounts.py)
and the platform nodes' enrollment tokens, printed as one JSON line.

    python -m marketplace.demo.setup TOKENS

`gpuflex demo` runs this with the cluster's environment rather than setting Django up in its
own process: Django, every app and the migrations stayed in the demo's memory for the whole
run (110 MB of the summed peak, issue 36), while the demo only needs them again for the
summary, after the agents and the worker have stopped.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main(argv: list[str]) -> None:
    if len(argv) != 1 or not argv[0].isdigit():
        raise SystemExit("usage: python -m marketplace.demo.setup TOKENS (a count)")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", "--noinput", verbosity=0)
    from marketplace.demo.accounts import create_people
    from marketplace.nodes.enrollment import create_enrollment_token

    people = create_people()
    tokens = [
        create_enrollment_token(operator=None, memo="demo cluster")[1] for _ in range(int(argv[0]))
    ]
    print(json.dumps({"people": {k: asdict(v) for k, v in people.items()}, "tokens": tokens}))


if __name__ == "__main__":
    main(sys.argv[1:])
