"""Agent endpoints of proof-of-learning segment checks (marketplace/proofs/services.py)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from marketplace.api.schema import errors
from marketplace.api.views.agent import SAFETENSORS, AgentView, _body
from marketplace.proofs.services import pending, reveal


class ProofRequestsView(AgentView):
    """The checkpoints this node is asked to reveal: [{id, task_id, steps, deadline}]."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response({"requests": pending(self.node(request))})


class ProofRevealView(AgentView):
    """One checkpoint (a paused-run safetensors file) of a segment check."""

    @extend_schema(
        request={SAFETENSORS: OpenApiTypes.BINARY},
        responses={200: OpenApiTypes.OBJECT, **errors(404, 409, 413, 422)},
    )
    def put(self, request: Request, check_id: int, step: int) -> Response:
        return Response(reveal(self.node(request), check_id, step, _body(request)))
