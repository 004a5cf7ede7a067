"""Typed, bounded schemas for what a node says about itself: hardware, benchmark, network,
availability, local datasets and heartbeat metrics (docs/agent-api.md).

Figures are JSON numbers, finite and within marketplace.nodes.bounds; a string, a bool, NaN
or an infinity is refused with the field's name. Texts and lists are bounded. Keys no schema
names are dropped rather than stored: what the marketplace keeps of a node is what it reads.
"""

# ruff: noqa: RUF012 - DRF declares fields as class attributes

from __future__ import annotations

import math
import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marketplace.nodes import bounds as b


class StrictFloatField(serializers.FloatField):
    """A JSON number only: DRF's FloatField would take "12.5" or "inf" spelled as a string,
    and True as 1.0."""

    default_error_messages = {"invalid": "A finite number is required (not a string)."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        try:
            finite = math.isfinite(data)
        except OverflowError:  # an integer past float's range (JSON allows 10**400): a 500
            finite = False
        if not finite:
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A whole number is required (not a string)."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, float) and not (math.isfinite(data) and data.is_integer()):
            self.fail("invalid")
        return super().to_internal_value(int(data))


def number(low: float, high: float, **kwargs: Any) -> StrictFloatField:
    return StrictFloatField(min_value=low, max_value=high, **kwargs)


def optional_number(low: float, high: float) -> StrictFloatField:
    """A figure the node may not know: absent or null both mean unknown."""
    return number(low, high, required=False, allow_null=True)


def text(max_length: int = b.SHORT_TEXT, **kwargs: Any) -> serializers.CharField:
    return serializers.CharField(
        max_length=max_length, required=False, allow_blank=True, trim_whitespace=False, **kwargs
    )


class FigureMapField(serializers.DictField):
    """{name: figure} with a bounded number of short names (per-model, per-precision)."""

    def __init__(self, low: float, high: float, **kwargs: Any) -> None:
        super().__init__(child=number(low, high, allow_null=True), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, float | None]:
        if isinstance(data, dict):
            if len(data) > b.MAX_DICT_KEYS:
                raise serializers.ValidationError(f"At most {b.MAX_DICT_KEYS} entries.")
            if any(not isinstance(k, str) or len(k) > b.SHORT_TEXT for k in data):
                raise serializers.ValidationError(f"Names are at most {b.SHORT_TEXT} characters.")
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "number", "minimum": 0, "maximum": b.MAX_SAMPLES_PER_S},
            {
                "type": "object",
                "maxProperties": b.MAX_DICT_KEYS,
                "additionalProperties": {"type": "number", "minimum": 0},
            },
        ],
        "nullable": True,
    }
)
class ThroughputField(serializers.Field):
    """`train_samples_per_s`: one figure, or one per reference model ({"mlp": 40000})."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            return FigureMapField(0, b.MAX_SAMPLES_PER_S).run_validation(data)
        return number(0, b.MAX_SAMPLES_PER_S).run_validation(data)

    def to_representation(self, value: Any) -> Any:
        return value


class GpuSerializer(serializers.Serializer):
    """desktop.hardware.GpuInfo."""

    index = StrictIntegerField(min_value=0, max_value=b.MAX_GPUS, required=False)
    vendor = text()
    name = text()
    memory_total_mb = optional_number(0, b.MAX_MEMORY_MB)
    backend = text(32)
    driver = text()
    uuid = text()
    compute_capability = text(32)
    temperature_c = optional_number(-100, b.MAX_TEMP_C)
    utilization_pct = optional_number(0, b.MAX_PERCENT)
    memory_used_mb = optional_number(0, b.MAX_MEMORY_MB)


class HardwareSerializer(serializers.Serializer):
    """desktop.agent.registration_hardware: the hardware report and the summary fields the
    marketplace schedules on (`gpu_model`, `memory_gb`)."""

    gpu_model = text()
    gpu_vendor = text()
    # what scheduling filters on: a number when given (null is refused, not taken as none)
    memory_gb = number(0, b.MAX_MEMORY_GB, required=False)
    memory_mb = number(0, b.MAX_MEMORY_MB, required=False)
    accelerator = text(32)
    driver = text()
    cpu_name = text(200)
    cpu_cores = StrictIntegerField(min_value=0, max_value=100_000, required=False)
    cpu_threads = StrictIntegerField(min_value=0, max_value=100_000, required=False)
    ram_total_mb = optional_number(0, b.MAX_MEMORY_MB)
    os = text(200)
    python = text(200)
    torch_version = text()
    torch_cuda = text()
    gpus = GpuSerializer(many=True, required=False, max_length=b.MAX_GPUS)
    notes = serializers.ListField(child=text(b.LONG_TEXT), required=False, max_length=b.MAX_NOTES)
    # the agent's sandbox: "full" confines a task, "limits" only caps its resources
    isolation = serializers.ChoiceField(choices=["full", "limits"], required=False)


class RuntimeSerializer(serializers.Serializer):
    """desktop.runtime.active.Runtime.report: the node's training runtime (its plan class, as
    desktop/runtime/plan.py names them, and its torch); the scheduler reads it
    (rounds.scheduling.node_view)."""

    plan = serializers.ChoiceField(choices=["cpu", "cuda12", "cuda13", "rocm", "mps"])
    torch = serializers.RegexField(r"^[0-9][0-9A-Za-z.+_-]*$", max_length=64)
    cuda = serializers.RegexField(
        r"^[0-9][0-9A-Za-z.+_-]*$", max_length=32, required=False, allow_blank=True, default=""
    )
    source = serializers.ChoiceField(choices=["pack", "environment"], required=False)


class BenchmarkSerializer(serializers.Serializer):
    """desktop.bench_result.BenchmarkResult.advertised."""

    device = text(200)
    fp32_tflops = optional_number(0, b.MAX_TFLOPS)
    fp16_tflops = optional_number(0, b.MAX_TFLOPS)
    bf16_tflops = optional_number(0, b.MAX_TFLOPS)
    memory_gbps = optional_number(0, b.MAX_GBPS)
    h2d_gbps = optional_number(0, b.MAX_GBPS)
    d2h_gbps = optional_number(0, b.MAX_GBPS)
    train_samples_per_s = ThroughputField(required=False, allow_null=True)
    peak_ratio = FigureMapField(0, 1000, required=False)


class NetworkSerializer(serializers.Serializer):
    """The node's link (desktop.netprobe.NetworkFigures, and a simulated link's loss)."""

    rtt_ms = optional_number(*b.NETWORK_BOUNDS["rtt_ms"])
    up_mbps = optional_number(*b.NETWORK_BOUNDS["up_mbps"])
    down_mbps = optional_number(*b.NETWORK_BOUNDS["down_mbps"])
    loss = optional_number(*b.NETWORK_BOUNDS["loss"])


# what desktop.local_datasets declares (a name the agent's CLI takes as an argument)
_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
LOCAL_KINDS = ("csv", "npz", "parquet", "image_folder")

_CLOCK = re.compile(r"^$|^([01]\d|2[0-3]):[0-5]\d$", re.ASCII)


class AvailabilitySerializer(serializers.Serializer):
    """The owner's work policy as the agent registers it (shown, not scheduled on)."""

    idle_minutes = optional_number(0, 7 * 24 * 60)
    schedule = serializers.ListField(
        child=serializers.RegexField(_CLOCK, allow_blank=True, max_length=5),
        required=False, min_length=2, max_length=2,
        help_text='["HH:MM", "HH:MM"]; both "": any time',
    )  # fmt: skip
    work_on_battery = serializers.BooleanField(required=False)
    hours = text()


class LocalDatasetSerializer(serializers.Serializer):
    """A federated silo the node holds: its name and how many rows it has, which bounds the
    sample count (the averaging weight) of its updates; and what the agent read of it
    (desktop/local_datasets.py): its schema and content hash, never a row."""

    name = serializers.RegexField(_DATASET_NAME, max_length=b.SHORT_TEXT)
    rows = StrictIntegerField(min_value=1, max_value=b.MAX_DATASET_ROWS)
    content_hash = serializers.RegexField(
        r"^[0-9a-f]{64}$", required=False, help_text="sha256 of the file (or folder's files)"
    )
    kind = serializers.ChoiceField(choices=LOCAL_KINDS, required=False)
    input_shape = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=b.MAX_INPUT_DIM), required=False,
        min_length=1, max_length=b.MAX_INPUT_DIMS, help_text="features per row, or [C, H, W]",
    )  # fmt: skip
    num_classes = StrictIntegerField(min_value=2, max_value=b.MAX_CLASSES, required=False)
    columns = serializers.ListField(
        child=text(), required=False, max_length=b.MAX_SCHEMA_NAMES,
        help_text="a table's column names, the label column included",
    )  # fmt: skip
    classes = serializers.ListField(
        child=text(), required=False, max_length=b.MAX_SCHEMA_NAMES,
        help_text="an image folder's class names",
    )  # fmt: skip


def without_nulls(data: dict[str, Any]) -> dict[str, Any]:
    """Unknown figures are left out, as the agent leaves them out (null means unknown)."""
    return {k: v for k, v in data.items() if v is not None}
