"""Providers register and list their nodes; each registration returns the node's own key."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.accounts.models import ApiKey
from marketplace.accounts.services import issue_node_key, revoke_key
from marketplace.api.permissions import IsOperator, IsProvider
from marketplace.api.schema import ErrorSerializer
from marketplace.api.serializers.nodes import (
    EnrollmentTokenRequestSerializer,
    EnrollmentTokenSerializer,
    NodeCreatedSerializer,
    NodeRegisterSerializer,
    NodeSerializer,
)
from marketplace.nodes.enrollment import create_enrollment_token
from marketplace.nodes.selectors import nodes_of
from marketplace.nodes.services import register_node


class NodeListView(generics.ListAPIView):
    permission_classes = [IsProvider]
    serializer_class = NodeSerializer

    def get_queryset(self):
        return nodes_of(self.request.user)

    @extend_schema(
        request=NodeRegisterSerializer,
        responses={
            201: NodeCreatedSerializer,
            403: OpenApiResponse(
                ErrorSerializer,
                description="kind 'platform' without a valid operator enrollment token "
                "(error enrollment_required, field enrollment_token), or not a provider's key",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        body = NodeRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node, key = register_node(owner=request.user, **body.validated_data)
        data = NodeSerializer(node).data | {"node_key": key}
        return Response(data, status=status.HTTP_201_CREATED)


class NodeDetailView(generics.RetrieveAPIView):
    permission_classes = [IsProvider]
    serializer_class = NodeSerializer

    def get_queryset(self):
        return nodes_of(self.request.user)


class NodeKeyView(APIView):
    """Rotate a node's credential: the old key stops working at once."""

    permission_classes = [IsProvider]

    @extend_schema(request=None, responses={201: NodeCreatedSerializer})
    def post(self, request: Request, pk: int) -> Response:
        node = get_object_or_404(nodes_of(request.user), pk=pk)
        with transaction.atomic():
            for key in ApiKey.objects.filter(node=node, revoked_at__isnull=True):
                revoke_key(key)
            _, plaintext = issue_node_key(node)
        data = NodeSerializer(node).data | {"node_key": plaintext}
        return Response(data, status=status.HTTP_201_CREATED)


class EnrollmentTokenView(APIView):
    """An operator makes a token that enrolls platform nodes (docs/operations.md)."""

    permission_classes = [IsOperator]

    @extend_schema(
        request=EnrollmentTokenRequestSerializer, responses={201: EnrollmentTokenSerializer}
    )
    def post(self, request: Request) -> Response:
        body = EnrollmentTokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token, plaintext = create_enrollment_token(operator=request.user, **body.validated_data)
        data = {
            "id": token.pk, "prefix": token.prefix, "uses_left": token.uses_left,
            "expires_at": token.expires_at, "memo": token.memo, "created_at": token.created_at,
            "enrollment_token": plaintext,
        }  # fmt: skip
        return Response(EnrollmentTokenSerializer(data).data, status=status.HTTP_201_CREATED)
