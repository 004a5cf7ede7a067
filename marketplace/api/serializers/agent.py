"""Bodies of the agent endpoints, as docs/agent-api.md defines them."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rest_framework import serializers

from marketplace.api.serializers import numbers
from marketplace.api.serializers.node_data import (
    NetworkSerializer,
    RuntimeSerializer,
    StrictFloatField,
    number,
)
from marketplace.api.serializers.plain import PlainWriter
from marketplace.api.serializers.reused_fields import ReusedFields
from marketplace.nodes import bounds as b
from marketplace.rounds.scheduling import MAX_CLAIM_BATCH, MAX_HEARTBEAT_TASKS
from marketplace.rounds.uploads import FAIL_REASONS


class HeartbeatMetricsSerializer(serializers.Serializer):
    """What the agent's heartbeat reports of its GPU (desktop.hardware.gpu_metrics)."""

    gpu_util = number(0, b.MAX_PERCENT, required=False)
    gpu_temp_c = number(-100, b.MAX_TEMP_C, required=False)
    gpu_mem_used_mb = number(0, b.MAX_MEMORY_MB, required=False)


class HeartbeatNetworkSerializer(NetworkSerializer):
    """The link as the node measures it now (stored over what it registered with)."""


class HeartbeatSerializer(ReusedFields, serializers.Serializer):
    """A heartbeat's body; its fields bound anew to each request's instance, not copied
    (reused_fields.py: the heartbeat is the most frequent request)."""

    state = serializers.ChoiceField(choices=["idle", "working", "paused", "waiting"])
    reason = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=200,
        help_text="why the node is paused or waiting (its work policy), in words",
    )  # fmt: skip
    task_id = serializers.CharField(
        required=False, allow_null=True, max_length=64, help_text="the task the node trains"
    )
    task_ids = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list,
        max_length=MAX_HEARTBEAT_TASKS,
        help_text="every task the node holds (training, prefetched, uploading): their leases "
        "are extended while the node is alive",
    )  # fmt: skip
    progress = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=1)
    metrics = HeartbeatMetricsSerializer(required=False, default=dict)
    network = HeartbeatNetworkSerializer(required=False, default=dict)
    runtime = RuntimeSerializer(
        required=False,
        help_text="sent when the node's training runtime changed since it registered (a pack "
        "fetched or removed); stored for the scheduler",
    )  # fmt: skip

    def to_internal_value(self, data: object) -> dict:
        out = super().to_internal_value(data)
        if out.get("runtime") is not None:
            out["runtime"] = dict(out["runtime"])
        # plain dicts for the JSON columns, unknown figures (null) left out
        for key in ("metrics", "network"):
            out[key] = {k: v for k, v in dict(out.get(key) or {}).items() if v is not None}
        return out


class HeartbeatReplySerializer(serializers.Serializer):
    server_time = serializers.DateTimeField()
    heartbeat_interval_s = serializers.FloatField()
    lease_timeout_s = serializers.FloatField()


class ClaimQuerySerializer(serializers.Serializer):
    wait = serializers.FloatField(required=False, default=0.0, min_value=0.0, max_value=30.0)
    max = numbers.IntegerField(
        required=False, default=1, min_value=1, max_value=MAX_CLAIM_BATCH,
        help_text="lease up to this many tasks in one claim",
    )  # fmt: skip


# what a claim's Idempotency-Key may be: a random token (the agent sends a UUID's hex)
CLAIM_KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")


def claim_key(headers: Mapping[str, str]) -> str | None:
    """The claim's `Idempotency-Key` header, None when absent; a malformed one is a 400 that
    says what it wants."""
    value = headers.get("Idempotency-Key")
    if value is None:
        return None
    if not CLAIM_KEY.fullmatch(value):
        raise serializers.ValidationError({"Idempotency-Key": [
            f"must be 8 to 64 letters, digits, '-' or '_' (a random token); got {value[:80]!r}"
        ]})  # fmt: skip
    return value


class ProbeQuerySerializer(serializers.Serializer):
    MAX_BYTES = 256 * 1024  # enough to time a fast link, too little to load the server

    bytes = numbers.IntegerField(
        required=False, default=32 * 1024, min_value=1, max_value=MAX_BYTES,
        help_text="how many random bytes to answer",
    )  # fmt: skip


class ModelSourceSerializer(ReusedFields, serializers.Serializer):
    """docs/agent-api.md, "Model delivery": how the node gets the round's model."""

    kind = serializers.ChoiceField(choices=["full", "seed", "delta"])
    base = serializers.CharField(required=False, help_text="delta: the model hash it starts from")
    chain = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="delta: the model hashes each step leads to, the task's model last",
    )  # fmt: skip
    input_shape = serializers.ListField(child=numbers.IntegerField(), required=False)
    num_classes = numbers.IntegerField(required=False, help_text="seed: the model's classes")


class ZoneRouteSerializer(serializers.Serializer):
    """docs/agent-api.md, "Zones": where a zones job's update goes instead."""

    name = serializers.CharField(help_text="the node's zone")
    aggregator = numbers.IntegerField(help_text="the aggregator's node id (for handoff)")
    url = serializers.CharField(help_text="the aggregator's zone endpoint")
    round_id = numbers.IntegerField()
    samples = numbers.IntegerField(help_text="the update's weight, which the token binds")
    token = serializers.CharField(help_text="the member token (X-GPUFlex-Zone-Token)")


class TaskSerializer(ReusedFields, serializers.Serializer):
    """docs/agent-api.md, "A task"."""

    id = serializers.UUIDField()
    job_id = serializers.UUIDField()
    round = numbers.IntegerField()
    kind = serializers.CharField()
    spec = serializers.DictField()
    steps = numbers.IntegerField()
    batch_size = numbers.IntegerField()
    seed = numbers.IntegerField()
    codec = serializers.CharField()
    proximal_mu = serializers.FloatField()
    lr = serializers.FloatField(
        help_text="the round's learning rate: optimizer.schedule applied to optimizer.lr "
        "(trainer.schedule.round_lr), constant through the task's local steps"
    )
    deadline = serializers.DateTimeField()
    model_hash = serializers.CharField()
    model_source = ModelSourceSerializer()
    shard_hash = serializers.CharField(allow_null=True)
    local_dataset = serializers.CharField(required=False, help_text="federated tasks only")
    program = serializers.BooleanField(
        required=False,
        help_text="exported models only: GET agent/tasks/ID/program for the .pt2 program",
    )
    overlap = serializers.BooleanField(
        required=False, default=False,
        help_text="train on while the update uploads and merge that progress into the job's "
        "next task (docs/agent-api.md, Overlap)",
    )  # fmt: skip
    zone = ZoneRouteSerializer(
        required=False,
        help_text="zones jobs: upload the update to this aggregator after a handoff",
    )
    footprint = serializers.DictField(
        child=numbers.IntegerField(), required=False,
        help_text="the model's size as training sees it (trainer.fit.Footprint: parameters, "
        "trainable, state_bytes, activation_bytes per sample), for the agent's fit check",
    )  # fmt: skip


class ClaimReplySerializer(ReusedFields, serializers.Serializer):
    task = TaskSerializer(help_text="the first (best) of `tasks`")
    tasks = TaskSerializer(many=True, help_text="every task this claim leased (see `max`)")


# the claim's reply as ClaimReplySerializer writes it, without DRF's per-field machinery
claim_reply = PlainWriter(ClaimReplySerializer)


class HandOffSerializer(serializers.Serializer):
    aggregator_id = numbers.IntegerField(help_text="the task's `zone.aggregator`")
    update_hash = serializers.RegexField(
        r"^[0-9a-f]{64}$", help_text="sha256 of the update bytes the node will upload to it"
    )


class FailSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(choices=sorted(FAIL_REASONS))
    detail = serializers.CharField(required=False, allow_blank=True, default="", max_length=1000)


class UploadOutcomeSerializer(serializers.Serializer):
    """What became of the node's upload (rounds.selectors.upload_outcome)."""

    status = serializers.ChoiceField(choices=["checking", "accepted", "refused"])
    update_hash = serializers.CharField(help_text="sha256 of the bytes it is about")
    reason = serializers.CharField(allow_blank=True, help_text="why it was refused")


class EarningsSerializer(serializers.Serializer):
    today = serializers.CharField()
    total = serializers.CharField()


class MeSerializer(serializers.Serializer):
    id = numbers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()
    reliability = serializers.FloatField()
    earnings = EarningsSerializer()
