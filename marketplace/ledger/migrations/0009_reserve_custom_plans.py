# ruff: noqa: RUF012 - Django declares a migration's dependencies and operations as class attributes
"""`gpuflex_reserve` plans its statements for each call (issue 36, eighth pass).

PL/pgSQL caches a plan for each statement of a function per connection, and after five calls
keeps a generic plan when it costs no more than the calls' own. A claim's connection makes
those five calls as a job's first leases are made, while `ledger_reservation` holds a few
rows: the cached plan for releasing the tasks' stale reservations then scanned the whole table,
and kept doing so as a burst of claims wrote thousands of reservations (2.5 to 5.8 ms of
PostgreSQL's CPU a claim, growing with the reservations, until autoanalyze invalidated the
plan). Planned per call, each statement reads the table's size as it is now; planning these
few small statements costs a fraction of that."""

from django.db import migrations

SIGNATURE = (
    "gpuflex_reserve(int, int[], uuid[], uuid[], bigint[], numeric[], float8[], float8[], "
    "timestamptz)"
)


def _custom(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER FUNCTION {SIGNATURE} SET plan_cache_mode = force_custom_plan")


def _cached(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER FUNCTION {SIGNATURE} RESET plan_cache_mode")


class Migration(migrations.Migration):
    dependencies = [("ledger", "0008_escrow_floor")]

    operations = [migrations.RunPython(_custom, _cached)]
