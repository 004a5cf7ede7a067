"""Secure aggregation's agent endpoints (node keys only): a thin layer over
marketplace.rounds.secagg and secagg_replies."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from marketplace.api.schema import errors
from marketplace.api.serializers.secagg import (
    KeysSerializer,
    SecAggRoundSerializer,
    SharesSerializer,
)
from marketplace.api.views.agent import AgentView
from marketplace.rounds.secagg_replies import accept_unmask


class SecAggView(AgentView):
    """GET: the round as this task's node may see it. POST: the node's public keys."""

    @extend_schema(responses={200: SecAggRoundSerializer, **errors(400)})
    def get(self, request: Request, task_id: str) -> Response:
        from marketplace.rounds import secagg

        return Response(secagg.status(self.node(request), task_id))

    @extend_schema(request=KeysSerializer, responses={200: SecAggRoundSerializer, **errors(409)})
    def post(self, request: Request, task_id: str) -> Response:
        from marketplace.rounds import secagg

        body = KeysSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(secagg.advertise(self.node(request), task_id, **body.validated_data))


class SecAggSharesView(AgentView):
    """GET: the shares sealed for this node (once the sharing set is fixed). POST: this
    node's shares, sealed for each other member."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(400, 409)})
    def get(self, request: Request, task_id: str) -> Response:
        from marketplace.rounds import secagg

        return Response({"shares": secagg.incoming(self.node(request), task_id)})

    @extend_schema(request=SharesSerializer, responses={200: SecAggRoundSerializer, **errors(409)})
    def post(self, request: Request, task_id: str) -> Response:
        from marketplace.rounds import secagg

        body = SharesSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        shares = body.validated_data["shares"]
        return Response(secagg.post_shares(self.node(request), task_id, shares))


class SecAggUnmaskView(AgentView):
    """POST: a survivor's revealed shares (a seed share per survivor, a key share per
    dropped node)."""

    @extend_schema(request=SharesSerializer, responses={200: SecAggRoundSerializer, **errors(409)})
    def post(self, request: Request, task_id: str) -> Response:
        body = SharesSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(accept_unmask(self.node(request), task_id, body.validated_data["shares"]))
