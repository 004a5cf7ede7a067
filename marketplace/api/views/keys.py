"""A user's own API keys: list, create (shown once; at most MAX_API_KEYS_PER_USER unrevoked,
and KeyCreateThrottle's rate), revoke."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.accounts.selectors import user_keys
from marketplace.accounts.services import issue_user_key, revoke_key
from marketplace.api.permissions import IsUser
from marketplace.api.schema import ErrorSerializer
from marketplace.api.serializers.keys import (
    ApiKeyCreatedSerializer,
    ApiKeyCreateSerializer,
    ApiKeySerializer,
)
from marketplace.api.throttles import KeyCreateThrottle, KeyRateThrottle


class KeyListView(generics.ListAPIView):
    permission_classes = [IsUser]
    serializer_class = ApiKeySerializer
    throttle_classes = [KeyRateThrottle, KeyCreateThrottle]  # new keys per user

    def get_queryset(self):
        return user_keys(self.request.user)

    @extend_schema(
        request=ApiKeyCreateSerializer,
        responses={
            201: ApiKeyCreatedSerializer,
            409: OpenApiResponse(
                ErrorSerializer,
                description="`key_limit_reached`: the user holds GPUFLEX_MAX_API_KEYS_PER_USER "
                "unrevoked keys already (the body's `limit`); revoking one makes room.",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        body = ApiKeyCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key, plaintext = issue_user_key(request.user, body.validated_data["name"])
        data = ApiKeySerializer(key).data | {"key": plaintext}
        return Response(data, status=status.HTTP_201_CREATED)


class KeyDetailView(APIView):
    permission_classes = [IsUser]

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        revoke_key(get_object_or_404(user_keys(request.user), pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
