"""Market capacity for buyers and operators' overview."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.db.models import Count
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.permissions import IsOperator, IsUser
from marketplace.api.serializers.nodes import NodeSerializer
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.nodes.selectors import market_capacity
from marketplace.rounds.models import Task


class CapacityView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response(market_capacity())


class OperatorNodesView(generics.ListAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer
    queryset = Node.objects.order_by("pk")


class OperatorSummaryView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        def counts(qs, field: str) -> dict[str, int]:
            return {r[field]: r["n"] for r in qs.values(field).annotate(n=Count("pk"))}

        return Response(
            {
                "jobs": counts(Job.objects.order_by(), "status"),
                "nodes": counts(Node.objects.order_by(), "state"),
                "tasks": counts(Task.objects.order_by(), "status"),
            }
        )
