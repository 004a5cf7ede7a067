# ruff: noqa: RUF012 - Django declares a migration's dependencies and operations as class attributes
"""`ledger_escrowfloor` (models.EscrowFloor) and `gpuflex_reserve` reading it: a claim's
check of its jobs' free escrow no longer sums every open reservation and escrow entry of the
job while a floor holds (issue 36). Per job of the claim, under its lock: the floor counts
while the job's escrow entries number what they did when it was written; when there is none,
or it is short of the claim's need, free escrow is computed exactly; the claim's need is then
taken off and the floor written. Only reservers write it, all under the job's lock; whatever
else happens to a job's escrow either only raises free escrow or adds an entry."""

import django.db.models.deletion
from django.db import migrations, models

FUNCTIONS = """
CREATE OR REPLACE FUNCTION gpuflex_escrow_entries(job uuid) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM ledger_entry e JOIN ledger_account a ON a.id = e.account_id
    WHERE a.job_id = job
$$;

CREATE OR REPLACE FUNCTION gpuflex_reserve(
    lock_class int, lock_keys int[], tasks uuid[], jobs uuid[], nodes bigint[],
    amounts numeric[], seconds float8[], speeds float8[], at timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
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

# the function as ledger 0007 made it, for a migration back
BEFORE = """
DROP FUNCTION IF EXISTS gpuflex_escrow_entries(uuid);
"""


def _create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTIONS)


def _drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        from importlib import import_module

        previous = import_module("marketplace.ledger.migrations.0007_reserve_function")
        schema_editor.execute(previous.FUNCTIONS)
        schema_editor.execute(BEFORE)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0016_job_runtime_needs"),
        ("ledger", "0007_reserve_function"),
    ]

    operations = [
        migrations.CreateModel(
            name="EscrowFloor",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="escrow_floor",
                        serialize=False,
                        to="jobs.job",
                    ),
                ),
                ("free", models.DecimalField(decimal_places=6, max_digits=20)),
                ("entries", models.PositiveBigIntegerField()),
            ],
        ),
        migrations.RunPython(_create, _drop),
    ]
