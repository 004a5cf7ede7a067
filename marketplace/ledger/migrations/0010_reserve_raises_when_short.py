# ruff: noqa: RUF012 - Django declares a migration's dependencies and operations as class attributes
"""`gpuflex_reserve` may raise when a job's free escrow is short (issue 36, tenth pass).

A claim's reservation is its transaction's last statement, and the job's escrow lock it takes
is held until that transaction ends. Sent with its `COMMIT` in one pipeline
(`reservations.reserve_all(..., commit=True)`), the lock is held for the call and the commit
only, not also for the reply's trip back to a Python thread that must get a core and its GIL
before it can send the `COMMIT` (most of the ~6.5 ms a claim held the lock under load here).
A `COMMIT` queued behind the call cannot depend on its result, so with `raise_short` the call
raises `GF001` (and PostgreSQL skips the queued `COMMIT`; the caller rolls back) where it
would return false. Without it, as before: false, nothing written."""

from django.db import migrations

OLD = (
    "gpuflex_reserve(int, int[], uuid[], uuid[], bigint[], numeric[], float8[], float8[], "
    "timestamptz)"
)
NEW = (
    "gpuflex_reserve(int, int[], uuid[], uuid[], bigint[], numeric[], float8[], float8[], "
    "timestamptz, boolean)"
)

FUNCTION = """
CREATE FUNCTION gpuflex_reserve(
    lock_class int, lock_keys int[], tasks uuid[], jobs uuid[], nodes bigint[],
    amounts numeric[], seconds float8[], speeds float8[], at timestamptz,
    raise_short boolean DEFAULT false
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    k int;
    need record;
    n_entries bigint;  -- named apart from the columns: plpgsql would find them ambiguous
    v_free numeric;
BEGIN
    FOREACH k IN ARRAY lock_keys LOOP
        PERFORM pg_advisory_xact_lock(lock_class, k);
    END LOOP;
    FOR need IN
        SELECT v.job, SUM(v.amount) AS amount
        FROM unnest(jobs, amounts) AS v(job, amount) GROUP BY v.job
    LOOP
        n_entries := gpuflex_escrow_entries(need.job);
        SELECT f.free INTO v_free FROM ledger_escrowfloor f
        WHERE f.job_id = need.job AND f.entries = n_entries;
        IF v_free IS NULL OR v_free < need.amount THEN
            v_free := gpuflex_free_escrow(need.job);
        END IF;
        IF v_free < need.amount THEN
            IF raise_short THEN
                RAISE EXCEPTION 'escrow of job % is short of its leases', need.job
                    USING ERRCODE = 'GF001';
            END IF;
            RETURN false;
        END IF;
        INSERT INTO ledger_escrowfloor (job_id, free, entries)
        VALUES (need.job, v_free - need.amount, n_entries)
        ON CONFLICT (job_id) DO UPDATE SET free = EXCLUDED.free, entries = EXCLUDED.entries;
    END LOOP;
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


def _create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {OLD}")
        schema_editor.execute(FUNCTION, params=None)  # its RAISE has a % of its own


def _drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        from importlib import import_module

        floor = import_module("marketplace.ledger.migrations.0008_escrow_floor")
        custom = import_module("marketplace.ledger.migrations.0009_reserve_custom_plans")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {NEW}")
        schema_editor.execute(floor.FUNCTIONS)
        custom._custom(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0009_reserve_custom_plans")]

    operations = [migrations.RunPython(_create, _drop)]
