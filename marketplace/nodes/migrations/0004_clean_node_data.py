"""Clean node figures stored before registration and heartbeats were validated: a figure
that is not a finite number within marketplace.nodes.bounds is dropped (as if the node had
not reported it), and the denormalised memory and reliability are brought within bounds, so
that 0005's constraints hold and no stored value breaks another user's claim or page."""

# ruff: noqa: RUF012 - Django declares a migration's operations as class attributes

from __future__ import annotations

import math
from decimal import Decimal

from django.db import migrations

from marketplace.nodes import bounds as b

BENCHMARK = b.BENCHMARK_BOUNDS
HARDWARE = {"memory_gb": (0.0, b.MAX_MEMORY_GB), "memory_mb": (0.0, b.MAX_MEMORY_MB)}


def _drop_bad(data: object, figures: dict[str, tuple[float, float]]) -> dict:
    if not isinstance(data, dict):
        return {}
    out = dict(data)
    for key, (low, high) in figures.items():
        if key in out and out[key] is not None and not b.finite_in(out[key], low, high):
            del out[key]
    return out


def clean(apps, schema_editor) -> None:
    Node = apps.get_model("nodes", "Node")
    for node in Node.objects.all().iterator():
        before = (node.hardware, node.benchmark, node.network, node.live_network, node.metrics,
                  node.memory_gb, node.reliability, node.price_per_gpu_hour)  # fmt: skip
        node.hardware = _drop_bad(node.hardware, HARDWARE)
        node.benchmark = _drop_bad(node.benchmark, BENCHMARK)
        if "train_samples_per_s" in node.benchmark:
            node.benchmark["train_samples_per_s"] = b.clean_throughput(
                node.benchmark["train_samples_per_s"]
            )
        node.network = b.clean_figures(node.network, b.NETWORK_BOUNDS)
        node.live_network = b.clean_figures(node.live_network, b.NETWORK_BOUNDS)
        if not isinstance(node.metrics, dict):
            node.metrics = {}
        if not b.finite_in(node.memory_gb, 0, b.MAX_MEMORY_GB):
            node.memory_gb = 0.0
        if not (isinstance(node.reliability, float) and math.isfinite(node.reliability)):
            node.reliability = 0.0
        node.reliability = min(max(node.reliability, 0.0), 1.0)
        if node.price_per_gpu_hour < 0:
            node.price_per_gpu_hour = Decimal(0)
        after = (node.hardware, node.benchmark, node.network, node.live_network, node.metrics,
                 node.memory_gb, node.reliability, node.price_per_gpu_hour)  # fmt: skip
        if after != before:
            node.save()


class Migration(migrations.Migration):
    dependencies = [("nodes", "0003_node_traffic")]

    operations = [migrations.RunPython(clean, migrations.RunPython.noop)]
