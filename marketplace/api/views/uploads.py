"""Buyers: chunked, resumable uploads of large datasets (docs/uploads.md).

POST uploads/ opens a session (size and sha256 declared, quota checked before any byte);
PUT uploads/{id}/ with Content-Range appends one chunk, streamed to disk; GET uploads/{id}/
says how far it got (to resume); POST uploads/{id}/finish checks size and hash and stores the
file; DELETE uploads/{id}/ drops it. A job names the finished upload in `dataset_upload`.
"""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.request import Request
from rest_framework.response import Response

from marketplace.api.permissions import IsBuyer
from marketplace.api.schema import errors
from marketplace.api.serializers.uploads import UploadCreateSerializer, UploadSerializer
from marketplace.jobs.errors import NotFound
from marketplace.numbers import header_length
from marketplace.uploads.selectors import upload_of, uploads_of
from marketplace.uploads.services import (
    abort_upload,
    create_upload,
    finish_upload,
    write_chunk,
)


class UploadListView(generics.ListAPIView):
    permission_classes = [IsBuyer]
    serializer_class = UploadSerializer

    def get_queryset(self):
        """Newest first; `?sha256=` and `?status=` find a session to resume."""
        qs = uploads_of(self.request.user).order_by("-created_at")
        params = self.request.query_params
        if params.get("sha256"):
            qs = qs.filter(sha256=params["sha256"].lower())
        if params.get("status"):
            qs = qs.filter(status=params["status"])
        return qs

    @extend_schema(request=UploadCreateSerializer, responses={201: UploadSerializer, **errors(413)})
    def post(self, request: Request) -> Response:
        body = UploadCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        upload = create_upload(owner=request.user, **body.validated_data)
        return Response(UploadSerializer(upload).data, status=status.HTTP_201_CREATED)


class UploadDetailView(generics.GenericAPIView):
    permission_classes = [IsBuyer]
    serializer_class = UploadSerializer

    def get_object(self):
        """The buyer's own upload (404 otherwise). DRF's OPTIONS calls this to describe PUT
        (the generic one needed a queryset this view has none of: a 500), and leaves PUT out
        on DRF's own NotFound, not on the domain's."""
        try:
            return upload_of(self.request.user, self.kwargs["pk"])
        except NotFound as exc:
            raise exceptions.NotFound(exc.detail) from None

    @extend_schema(responses={200: UploadSerializer})
    def get(self, request: Request, pk: str) -> Response:
        return Response(UploadSerializer(upload_of(request.user, pk)).data)

    @extend_schema(
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter(
                "Content-Range",
                str,
                OpenApiParameter.HEADER,
                required=True,
                description="bytes START-END/TOTAL: the chunk's first and last byte "
                "offsets (inclusive) and the file's size; START must be the upload's "
                "`received`",
            )
        ],
        responses={200: UploadSerializer, **errors(409, 413)},
    )
    def put(self, request: Request, pk: str) -> Response:
        """One chunk, streamed to disk as it arrives; the body is never parsed or held."""
        length = request.META.get("CONTENT_LENGTH")
        upload = write_chunk(
            owner=request.user,
            upload_id=pk,
            content_range=request.headers.get("Content-Range"),
            content_length=header_length(length),
            stream=request.stream,
        )
        return Response(UploadSerializer(upload).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: str) -> Response:
        abort_upload(owner=request.user, upload_id=pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UploadFinishView(generics.GenericAPIView):
    permission_classes = [IsBuyer]
    serializer_class = UploadSerializer

    @extend_schema(request=None, responses={200: UploadSerializer, **errors(409)})
    def post(self, request: Request, pk: str) -> Response:
        return Response(UploadSerializer(finish_upload(owner=request.user, upload_id=pk)).data)
