# ruff: noqa  (makemigrations, with the copy of the old rows added by hand)

from django.db import migrations, models


def copy_speeds(apps, schema_editor):
    """Each NodeSpeed row onto its node: what billing used becomes the figure, the observed
    average the observed mean, a mismatch its flag."""
    NodeSpeed = apps.get_model("nodes", "NodeSpeed")
    Node = apps.get_model("nodes", "Node")
    for row in NodeSpeed.objects.all().iterator():
        Node.objects.filter(pk=row.node_id).update(
            speed_tflops=row.billed_tflops if row.observed_tflops is not None else None,
            speed_observed_tflops=row.observed_tflops,
            speed_tasks=row.tasks,
            speed_flag=(row.note or "flagged")[:300] if row.mismatch else "",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0009_node_runtime"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="speed_tflops",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="speed_observed_tflops",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="speed_tasks",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="node",
            name="speed_flag",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
        migrations.RunPython(copy_speeds, migrations.RunPython.noop),
        migrations.DeleteModel(name="NodeSpeed"),
    ]
