# ruff: noqa: RUF012 - Django declares a migration's dependencies and operations as class attributes
"""PostgreSQL functions for a claim's escrow reservations (ledger/reservations.py).

`gpuflex_free_escrow(job)`: a job's escrow balance less its open reservations, the one
formula both `free_escrow` and `gpuflex_reserve` read.

`gpuflex_reserve(...)`: a claim's reservations, all or none, in one round trip: it takes the
jobs' advisory locks (in the order given: key order), then, each statement with a fresh
snapshot (a VOLATILE plpgsql function under READ COMMITTED sees what the lock's previous
holder committed), checks every job's free escrow covers its share, releases stale open
reservations of the tasks and writes the new ones. The locks are held until the claim
commits, so the claim's time under them is this call and its commit, not four round
trips each waiting for the server thread's turn (issue 36, fourth pass)."""

from django.db import migrations

FUNCTIONS = """
CREATE OR REPLACE FUNCTION gpuflex_free_escrow(job uuid) RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT SUM(e.amount) FROM ledger_entry e
                     JOIN ledger_account a ON a.id = e.account_id
                     WHERE a.job_id = job), 0)
         - COALESCE((SELECT SUM(r.amount) FROM ledger_reservation r
                     WHERE r.job_id = job AND r.state = 'open'), 0)
$$;

CREATE OR REPLACE FUNCTION gpuflex_reserve(
    lock_class int, lock_keys int[], tasks uuid[], jobs uuid[], nodes bigint[],
    amounts numeric[], seconds float8[], speeds float8[], at timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k int;
BEGIN
    FOREACH k IN ARRAY lock_keys LOOP
        PERFORM pg_advisory_xact_lock(lock_class, k);
    END LOOP;
    IF EXISTS (
        SELECT 1
        FROM (SELECT v.job, SUM(v.amount) AS need
              FROM unnest(jobs, amounts) AS v(job, amount) GROUP BY v.job) AS n
        WHERE gpuflex_free_escrow(n.job) < n.need
    ) THEN
        RETURN false;
    END IF;
    UPDATE ledger_reservation SET state = 'released', closed_at = at
    WHERE state = 'open' AND task_id = ANY(tasks);
    INSERT INTO ledger_reservation (task_id, job_id, node_id, amount, seconds, speed, state,
                                    created_at)
    SELECT v.task, v.job, v.node, v.amount, v.seconds, v.speed, 'open', at
    FROM unnest(tasks, jobs, nodes, amounts, seconds, speeds)
        AS v(task, job, node, amount, seconds, speed);
    RETURN true;
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS gpuflex_reserve(int, int[], uuid[], uuid[], bigint[], numeric[],
                                        float8[], float8[], timestamptz);
DROP FUNCTION IF EXISTS gpuflex_free_escrow(uuid);
"""


def _create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTIONS)


def _drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0006_earnings_holds")]

    operations = [migrations.RunPython(_create, _drop)]
