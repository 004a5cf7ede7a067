"""The move of the round, task and result models from jobs to their own app (#13) keeps the
rows: a database as it was before the move (jobs 0008) migrates forward with its rounds,
tasks, results, the nodes' copies and the ledger's link to a result, now in rounds_* tables,
and with the moved models' content types (and so the permissions on them).

It runs on the suite's own database (PostgreSQL or SQLite), migrating it back and forth, and
leaves it migrated to the latest state whatever happens."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from marketplace.ledger.models import Transaction
from marketplace.rounds.models import ModelCopy, Round, ShardCopy, Task, TaskResult

# the state before the move: rounds not yet an app, jobs and the ledger as they were
# nodes goes back too: a column added since, NOT NULL without a database default, would
# refuse the historical models' rows
BEFORE = [("jobs", "0008_shard_generations"), ("ledger", "0001_initial"), ("rounds", None),
          ("nodes", "0005_enrollment_and_bounds")]  # fmt: skip
ROUNDS_TABLES = {"rounds_round", "rounds_task", "rounds_taskresult", "rounds_modelcopy",
                 "rounds_shardcopy"}  # fmt: skip
OLD_TABLES = {t.replace("rounds_", "jobs_") for t in ROUNDS_TABLES}


def _migrate(targets: list[tuple[str, str | None]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)  # a fresh one: it reads what is applied now
    executor.migrate(targets)
    return executor


def _latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def _tables() -> set[str]:
    return set(connection.introspection.table_names())


def _old_rows(apps) -> dict[str, object]:
    """A job with a round, a task, its result, the ledger's charge for it and a node's copies
    of the model and the shard, through the historical (jobs 0008) models."""
    user = apps.get_model("accounts", "User").objects.create(username="buyer-before-the-move")
    node = apps.get_model("nodes", "Node").objects.create(
        owner=user, name="n1", price_per_gpu_hour=Decimal("0.5")
    )
    job = apps.get_model("jobs", "Job").objects.create(
        buyer=user, name="old job", spec={}, max_price_per_gpu_hour=Decimal("1")
    )
    shard = apps.get_model("jobs", "Shard").objects.create(
        job=job, index=0, file="s0", content_hash="h0", size=10
    )
    rnd = apps.get_model("jobs", "Round").objects.create(
        job=job, number=1, status="done", input_model_hash="m1", input_model_file="m1.bin",
        deadline=timezone.now() + timedelta(minutes=5), metrics={"accuracy": 0.5},
    )  # fmt: skip
    task = apps.get_model("jobs", "Task").objects.create(
        id=uuid.uuid4(), round=rnd, shard=shard, seed=7, status="done", node=node, steps=3
    )
    result = apps.get_model("jobs", "TaskResult").objects.create(
        task=task, node=node, update_file="u1", update_hash="uh1", num_samples=10, compute_s=2.5
    )
    apps.get_model("jobs", "ModelCopy").objects.create(
        node=node, job=job, round_number=1, model_hash="m1"
    )
    apps.get_model("jobs", "ShardCopy").objects.create(node=node, shard=shard)
    apps.get_model("ledger", "Transaction").objects.create(
        key="charge-before-the-move", kind="charge", job=job, node=node, task_result=result
    )
    # a permission on a moved model: its content type moves along
    content_type, _ = apps.get_model("contenttypes", "ContentType").objects.get_or_create(
        app_label="jobs", model="round"
    )
    apps.get_model("auth", "Permission").objects.create(
        codename="audit_round", name="Can audit rounds", content_type=content_type
    )
    return {"job": job.pk, "round": rnd.pk, "task": task.pk, "result": result.pk}


@pytest.mark.django_db(transaction=True)
def test_the_rows_follow_the_models_into_the_rounds_app() -> None:
    latest = _latest()
    try:
        executor = _migrate(BEFORE)
        assert _tables() >= OLD_TABLES and not ROUNDS_TABLES & _tables()
        old_apps = executor.loader.project_state(
            [node for node in BEFORE if node[1] is not None]
        ).apps
        ids = _old_rows(old_apps)
    finally:
        _migrate(latest)

    assert _tables() >= ROUNDS_TABLES and not OLD_TABLES & _tables()
    rnd = Round.objects.get(pk=ids["round"])
    assert (rnd.job_id, rnd.number, rnd.metrics) == (ids["job"], 1, {"accuracy": 0.5})
    task = Task.objects.get(pk=ids["task"])
    assert (task.round_id, task.seed, task.steps) == (rnd.pk, 7, 3)
    result = TaskResult.objects.get(pk=ids["result"])
    assert (result.task_id, result.update_hash, result.compute_s) == (task.pk, "uh1", 2.5)
    assert Transaction.objects.get(key="charge-before-the-move").task_result == result
    assert ModelCopy.objects.get(job_id=ids["job"]).model_hash == "m1"
    assert ShardCopy.objects.get(shard=task.shard).node_id == task.node_id
    audit = Permission.objects.get(codename="audit_round")
    assert audit.content_type == ContentType.objects.get_for_model(Round)
    assert not ContentType.objects.filter(app_label="jobs", model__in=["round", "task"]).exists()
    # new rows go on where the old ids left off (the sequences came along with the tables)
    later = Round.objects.create(
        job_id=ids["job"], number=2, input_model_hash="m2", input_model_file="m2.bin",
        deadline=timezone.now() + timedelta(minutes=5),
    )  # fmt: skip
    assert later.pk > rnd.pk
