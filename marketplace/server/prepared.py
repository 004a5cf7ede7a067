"""Server-side prepared statements for the claim's hand-written statements (issue 36).

Django's psycopg cursors bind parameters on the client, so PostgreSQL parses and plans every
statement it is sent. For a claim's candidate read (two locked CTEs) planning took about
2 ms of PostgreSQL's CPU against 0.6 ms running it, and the node's read 0.4 against 0.1: a
claim's statements are the same text every time, so planning them once per connection is
most of what PostgreSQL spends on a claim. `prepared_cursor()` is Django's cursor (its
checks, its debug and execute wrappers, the query counts tests take) over a psycopg cursor
that binds on the server and prepares what it executes; psycopg keeps the prepared
statements per connection (`prepared_max`), and Django keeps connections for
`CONN_MAX_AGE`.

`GPUFLEX_DB_PREPARE=0` turns it off for a pooler that cannot carry prepared statements
across the server connections it hands out (PgBouncer before 1.21 in transaction mode).
Elsewhere (SQLite) it is Django's plain cursor.

`array_literal` writes a list parameter as PostgreSQL's array text, for a statement that
casts it (`%s::uuid[]`): psycopg's list adaptation inspects every element to choose the
array's type, which was a tenth of a claim's CPU for its fifteen short arrays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal
from functools import cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorWrapper


def prepared_cursor() -> CursorWrapper:
    """A cursor whose statements PostgreSQL plans once per connection; use it as
    `connection.cursor()` is used (`with prepared_cursor() as cursor:`)."""
    if connection.vendor != "postgresql" or not settings.GPUFLEX["DB_PREPARE"]:
        return connection.cursor()
    # what connection.cursor() does, with our cursor in place of Django's client-binding one
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = _psycopg().cursor(connection.connection)
        if connection.timezone != _psycopg().loader_zone(connection.connection):
            _psycopg().register_tzloader(connection.timezone, cursor)  # as Django's cursors
        return connection._prepare_cursor(cursor)


class _Psycopg:
    """What prepared_cursor needs of psycopg, imported on first use (PostgreSQL's only)."""

    def __init__(self) -> None:
        import psycopg
        from django.db.backends.postgresql.psycopg_any import register_tzloader
        from psycopg.pq import Format

        class Preparing(psycopg.Cursor):
            """psycopg's server-binding cursor, preparing every statement it runs."""

            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                kwargs["prepare"] = True
                return super().execute(query, params, **kwargs)

        self.cursor = Preparing
        self.register_tzloader = register_tzloader
        self._text = Format.TEXT

    def loader_zone(self, conn: Any) -> Any:
        adapters = conn.adapters
        return adapters.get_loader(adapters.types["timestamptz"].oid, self._text).timezone


@cache
def _psycopg() -> _Psycopg:
    return _Psycopg()


# written bare in an array literal (a tuple made once: `int | float | …` built a union type
# on every element, a claim's fifteen arrays over)
_BARE = (int, float, Decimal, UUID)


def array_literal(values: Iterable[Any]) -> str:
    """`values` as a PostgreSQL array literal ('{1,2,NULL}'), for a parameter the statement
    casts to its array type. Numbers and UUIDs are written bare; anything else quoted."""
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        elif isinstance(value, _BARE) and not isinstance(value, bool):
            parts.append(str(value))
        else:
            text = str(value).replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'"{text}"')
    return "{" + ",".join(parts) + "}"


_CONSTANT = re.compile(r"[a-z_]+")


def constant(value: str) -> str:
    """A status (a choice's value: lower-case letters and '_') as an SQL string literal,
    for a prepared statement's own text. A partial index (`task_pending_order`: WHERE status
    = 'pending') serves a generic plan only where the statement's text implies its
    predicate; with the status a parameter PostgreSQL cannot know it, and the claim's
    candidate read walked every leased task of the round before the first pending one
    (2.4 ms of PostgreSQL's CPU with 5,000 leased, against 0.8 ms on the partial index)."""
    text = str(value)
    if not _CONSTANT.fullmatch(text):
        raise ValueError(f"{text!r} is not a status's value")
    return f"'{text}'"
