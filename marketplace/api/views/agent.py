"""The agent endpoints of docs/agent-api.md (node keys only)."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.claim_fast import claimed
from marketplace.api.encoding import encoded_response
from marketplace.api.permissions import IsNode
from marketplace.api.schema import errors
from marketplace.api.serializers.agent import (
    ClaimQuerySerializer,
    ClaimReplySerializer,
    FailSerializer,
    HandOffSerializer,
    HeartbeatReplySerializer,
    HeartbeatSerializer,
    MeSerializer,
    ProbeQuerySerializer,
    UploadOutcomeSerializer,
    claim_key,
)
from marketplace.api.serializers.nodes import LocalDatasetsSerializer
from marketplace.api.throttles import HeartbeatThrottle, ProbeThrottle
from marketplace.jobs import files
from marketplace.jobs.errors import LocalDataset, NotFound, TooLarge
from marketplace.ledger.selectors import node_earnings
from marketplace.nodes.models import Node
from marketplace.nodes.services import (
    count_traffic,
    declare_local_datasets,
    record_heartbeat,
    touch,
)
from marketplace.rounds.delivery import model_bytes, record_model, record_shard
from marketplace.rounds.selectors import upload_outcome
from marketplace.rounds.uploads import accept_update, fail_task, task_for_node

SAFETENSORS = "application/octet-stream"


class AgentView(APIView):
    permission_classes = [IsNode]

    def node(self, request: Request) -> Node:
        return request.auth.node


class HeartbeatView(AgentView):
    # every heartbeat but the plain ones, which api/heartbeat_fast.py answers ahead of the
    # middleware in one Redis round trip: this view's answers are the reference for those
    throttle_classes = [HeartbeatThrottle]

    @extend_schema(request=HeartbeatSerializer, responses=HeartbeatReplySerializer)
    def post(self, request: Request) -> Response:
        body = HeartbeatSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        # the key's node id, not its row: with Redis presence a heartbeat reads nothing
        reply = record_heartbeat(request.auth.node_id, **body.validated_data)
        return Response(HeartbeatReplySerializer(reply).data)


class ClaimView(AgentView):
    @extend_schema(
        request=None,
        parameters=[
            OpenApiParameter("wait", float, description="long poll seconds, at most 30"),
            OpenApiParameter("max", int, description="lease up to this many tasks, at most 8"),
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="a random token (8 to 64 of A-Z a-z 0-9 - _), the same on every "
                "re-send of one claim: a claim whose answer was lost, sent again with its key, "
                "is answered with the tasks it leased, and nothing more is leased",
            ),
        ],
        responses={200: ClaimReplySerializer, 204: OpenApiResponse(description="no work came")},
    )
    def post(self, request: Request) -> Response:
        query = ClaimQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        key = claim_key(request.headers)
        touch(request.auth.node_id)
        # the node's id: its row is read with the open rounds, in the claim's first statement
        reply = claimed(
            request.auth.node_id, query.validated_data["wait"], query.validated_data["max"], key
        )
        if reply is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(reply)


class TaskModelView(AgentView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "base",
                str,
                description="a model hash the node holds: answer the one delta "
                "that leads from it one round on (the task's model_source.chain)",
            )
        ],
        responses={(200, SAFETENSORS): OpenApiTypes.BINARY},
    )
    def get(self, request: Request, task_id: str) -> HttpResponse:
        node = self.node(request)
        task = task_for_node(node, task_id)
        data, leads_to = model_bytes(task, request.query_params.get("base"))
        response = encoded_response(request, data, SAFETENSORS)
        count_traffic(node.pk, task.round.job_id, down=len(response.content))
        if leads_to == task.round.input_model_hash:
            record_model(node, task.round.job_id, task.round)
        response["X-GPUFlex-Model-Hash"] = leads_to
        return response


class TaskShardView(AgentView):
    @extend_schema(responses={(200, SAFETENSORS): OpenApiTypes.BINARY, **errors(409)})
    def get(self, request: Request, task_id: str) -> HttpResponse:
        node = self.node(request)
        task = task_for_node(node, task_id)
        if task.shard is None:
            raise LocalDataset(
                f"This task trains on your local dataset {task.round.job.federated_dataset!r}; "
                "there is no shard to download."
            )
        response = encoded_response(request, files.get(task.shard.file), SAFETENSORS)
        count_traffic(node.pk, task.round.job_id, down=len(response.content))
        record_shard(node, task.shard)
        return response


class TaskProgramView(AgentView):
    """An exported model's program (model.arch: exported): the graph a node trains, read by
    its sandboxed runner through trainer.exported (never unpickled). Its weights come as
    every model's do, the round's safetensors from /model."""

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request: Request, task_id: str) -> HttpResponse:
        from marketplace.jobs.model_files import program_name

        node = self.node(request)
        task = task_for_node(node, task_id)
        if task.round.job.parsed_spec.model.arch != "exported":
            raise NotFound("This task's model is built from its spec; it has no program.")
        data = files.get(program_name(task.round.job_id))
        count_traffic(node.pk, task.round.job_id, down=len(data))
        return HttpResponse(data, content_type="application/octet-stream")


class TaskUpdateView(AgentView):
    @extend_schema(
        request={SAFETENSORS: OpenApiTypes.BINARY},
        parameters=[OpenApiParameter("X-GPUFlex-Metrics", str, OpenApiParameter.HEADER)],
        responses={202: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT, **errors(409, 413, 422)},
    )
    def put(self, request: Request, task_id: str) -> Response:
        node = self.node(request)
        task = task_for_node(node, task_id)  # 404 before reading a body that is not ours
        limit = settings.GPUFLEX["MAX_UPDATE_BYTES"]
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > limit:
            raise TooLarge(f"The update is {declared} bytes; the limit is {limit} bytes.")
        try:
            body = request.body
        except RequestDataTooBig:
            raise TooLarge(f"The update is larger than the limit of {limit} bytes.") from None
        # received whatever becomes of it (a retry, a rejection): the node's traffic all the same
        count_traffic(node.pk, task.round.job_id, up=len(body))
        code = accept_update(node, task_id, body, request.headers.get("X-GPUFlex-Metrics"))
        # 202: received, the worker checks it (a refusal releases the task, reason kept)
        return Response({"accepted": True, "checked": code != 202}, status=code)

    @extend_schema(responses={200: UploadOutcomeSerializer, **errors(404)})
    def get(self, request: Request, task_id: str) -> Response:
        """What became of the node's upload: a 202 said only that it was received."""
        outcome = upload_outcome(self.node(request), task_id)
        return Response(UploadOutcomeSerializer(outcome).data)


def _body(request: Request) -> bytes:
    limit = settings.GPUFLEX["MAX_UPDATE_BYTES"]
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    if declared > limit:
        raise TooLarge(f"The update is {declared} bytes; the limit is {limit} bytes.")
    try:
        return request.body
    except RequestDataTooBig:
        raise TooLarge(f"The update is larger than the limit of {limit} bytes.") from None


class TaskHandOffView(AgentView):
    """A zones job's member is about to upload the task's update to its zone's aggregator."""

    @extend_schema(request=HandOffSerializer, responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def post(self, request: Request, task_id: str) -> Response:
        from marketplace.rounds.zones import hand_off

        body = HandOffSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        hand_off(self.node(request), task_id, **body.validated_data)
        return Response({"handed": True})


class ZoneRoundView(AgentView):
    """An aggregator's view of one round: its member-token key and the tasks to expect."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(404, 409)})
    def get(self, request: Request, round_id: int) -> Response:
        from marketplace.rounds.zones import zone_round

        return Response(zone_round(self.node(request), round_id))


class ZoneModelView(AgentView):
    @extend_schema(responses={(200, SAFETENSORS): OpenApiTypes.BINARY, **errors(404, 409)})
    def get(self, request: Request, round_id: int) -> HttpResponse:
        from marketplace.rounds.zones import zone_model

        return encoded_response(request, zone_model(self.node(request), round_id), SAFETENSORS)


class ZonePartialView(AgentView):
    """An aggregator's pre-aggregated upload: safetensors, the manifest in its metadata."""

    @extend_schema(
        request={SAFETENSORS: OpenApiTypes.BINARY},
        responses={202: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT, **errors(409, 413, 422)},
    )
    def put(self, request: Request) -> Response:
        from marketplace.rounds.zones import accept_partial

        node = self.node(request)
        body = _body(request)
        code, receipt = accept_partial(node, body)
        count_traffic(node.pk, receipt.job_id, up=len(body))
        # 202: received, the worker checks it (a refusal releases its members, reason kept)
        return Response(
            {"accepted": True, "checked": code != 202, "members": receipt.members}, status=code
        )


class TaskFailView(AgentView):
    @extend_schema(request=FailSerializer, responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def post(self, request: Request, task_id: str) -> Response:
        body = FailSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fail_task(self.node(request), task_id, **body.validated_data)
        return Response({"released": True})


class ProbeView(AgentView):
    """The link test an agent runs as it starts, so that its first round is planned on its
    measured up and down rates rather than a guess. The bytes are random (no encoding
    shrinks them) and belong to no job's traffic."""

    throttle_classes = [ProbeThrottle]

    @extend_schema(
        parameters=[ProbeQuerySerializer], responses={(200, SAFETENSORS): OpenApiTypes.BINARY}
    )
    def get(self, request: Request) -> HttpResponse:
        query = ProbeQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return HttpResponse(os.urandom(query.validated_data["bytes"]), content_type=SAFETENSORS)

    @extend_schema(
        request={SAFETENSORS: OpenApiTypes.BINARY},
        responses={200: OpenApiTypes.OBJECT, **errors(413)},
    )
    def post(self, request: Request) -> Response:
        limit = ProbeQuerySerializer.MAX_BYTES
        if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            raise TooLarge(f"A link probe carries at most {limit} bytes.")
        return Response({"received": len(request.body)})


class LocalDatasetsView(AgentView):
    """The local datasets (federated silos) this node holds now: their names, schemas, row
    counts and content hashes, never their rows (desktop/local_datasets.py)."""

    @extend_schema(request=LocalDatasetsSerializer, responses=LocalDatasetsSerializer)
    def put(self, request: Request) -> Response:
        body = LocalDatasetsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        datasets = body.validated_data["local_datasets"]
        declare_local_datasets(self.node(request), datasets)
        return Response({"local_datasets": datasets})


class MeView(AgentView):
    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        node = Node.objects.get(pk=self.node(request).pk)
        data = {
            "id": node.pk,
            "name": node.name,
            "state": node.state,
            "reliability": node.reliability,
            "earnings": node_earnings(node),
        }
        return Response(MeSerializer(data).data)
