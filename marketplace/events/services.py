"""What the rest of the marketplace calls when something a live page shows has changed.

Each call rings after the surrounding transaction commits (at once outside one), so a
stream never renders a state that is then rolled back, and never renders before the change
is visible to it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction

from marketplace.events import topics
from marketplace.events.doorbell import ring


def _after_commit(names: Iterable[str]) -> None:
    names = [*names, topics.OPERATOR]  # the operator's overview counts everything
    transaction.on_commit(lambda: ring(names))


def job_changed(*job_ids: object) -> None:
    _after_commit(topics.job(j) for j in job_ids)


def money_changed(*user_ids: object) -> None:
    _after_commit(topics.money(u) for u in user_ids)


def nodes_changed() -> None:
    _after_commit(())
