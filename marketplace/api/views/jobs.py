"""Buyers: submit, list, inspect, control and download jobs. Other buyers' jobs are 404."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

import re

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.parsers import DepthLimitedJSONParser
from marketplace.api.permissions import IsBuyer
from marketplace.api.schema import errors
from marketplace.api.serializers.jobs import (
    JobDetailSerializer,
    JobSerializer,
    JobSubmitSerializer,
    RoundSerializer,
)
from marketplace.api.throttles import KeyRateThrottle, SubmitThrottle
from marketplace.events import topics
from marketplace.events.stream import CONTENT_TYPE, event_stream
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict
from marketplace.jobs.models import ACTIVE_STATUSES, Job
from marketplace.jobs.selectors import jobs_of
from marketplace.jobs.services import cancel_job, pause_job, resume_job
from marketplace.jobs.submission import submit_job
from marketplace.jobs.tracking import job_record
from marketplace.rounds.selectors import rounds_of
from trainer.export_formats import FORMATS

_ID_PREFIX = re.compile(r"[0-9a-f-]+")


class BuyerView(APIView):
    permission_classes = [IsBuyer]

    def job(self, request: Request, pk: str) -> Job:
        return get_object_or_404(jobs_of(request.user), pk=pk)


class JobListView(generics.ListAPIView):
    permission_classes = [IsBuyer]
    serializer_class = JobSerializer
    parser_classes = [DepthLimitedJSONParser, MultiPartParser, FormParser]
    throttle_classes = [KeyRateThrottle, SubmitThrottle]  # submissions per buyer

    def get_queryset(self):
        jobs = jobs_of(self.request.user).order_by("-created_at")
        prefix = self.request.query_params.get("id_prefix")
        if prefix is not None:
            jobs = jobs.filter(id__startswith=_id_prefix(prefix))
        return jobs

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "id_prefix",
                str,
                required=False,
                description="only jobs whose id starts with this (hex digits and hyphens, as "
                "the web shows the first 8): how `gpuflex` resolves a short id",
            )
        ]
    )
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer, **errors(402, 413)})
    def post(self, request: Request) -> Response:
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        job = submit_job(
            buyer=request.user,
            spec_data=data["spec"],
            dataset_upload=data.get("dataset"),
            dataset_upload_id=data.get("dataset_upload"),
            tier=data["tier"],
            budget=data["budget"],
            max_price_per_gpu_hour=data.get("max_price_per_gpu_hour"),
            federated_dataset=data["federated_dataset"],
            model_config=data.get("model_config"),
            model_checkpoint=data.get("model_checkpoint"),
            model_program=data.get("model_program"),
            dataset_tokenizer=data.get("dataset_tokenizer"),
        )
        job = jobs_of(request.user).get(pk=job.pk)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)


def _id_prefix(text: str) -> str:
    """A job id's start as the database compares it: lowercase hex digits and hyphens."""
    prefix = text.strip().lower()
    if not prefix or len(prefix) > 36 or not _ID_PREFIX.fullmatch(prefix):
        raise serializers.ValidationError(
            {"id_prefix": ["The start of a job id: 1 to 36 hex digits and hyphens."]}
        )
    return prefix


class JobDetailView(generics.RetrieveAPIView):
    permission_classes = [IsBuyer]
    serializer_class = JobDetailSerializer

    def get_queryset(self):
        return jobs_of(self.request.user)


class JobRoundsView(generics.ListAPIView):
    permission_classes = [IsBuyer]
    serializer_class = RoundSerializer

    def get_queryset(self):
        job = get_object_or_404(jobs_of(self.request.user), pk=self.kwargs["pk"])
        return rounds_of(job)


class JobActionView(BuyerView):
    action_name = ""
    actions = {"pause": pause_job, "resume": resume_job, "cancel": cancel_job}

    @extend_schema(request=None, responses={200: JobSerializer, **errors(409)})
    def post(self, request: Request, pk: str) -> Response:
        job = self.actions[self.action_name](self.job(request, pk))
        return Response(JobSerializer(jobs_of(request.user).get(pk=job.pk)).data)


class FormatIsTheModelFormat(DefaultContentNegotiation):
    """Here `?format=` names the model's export format, not a DRF renderer (its default use
    of the parameter): answers and errors are always rendered by the first renderer, JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):  # type: ignore[override]
        return renderers[0], renderers[0].media_type


class JobModelView(BuyerView):
    content_negotiation_class = FormatIsTheModelFormat

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "format",
                str,
                enum=list(FORMATS),
                default="safetensors",
                description="safetensors (the stored state dict), onnx, torchscript, hf (a "
                "zip of config.json and model.safetensors; transformer models only), or pt2 "
                "(an exported model's program, trained). onnx, torchscript and hf are made by "
                "a worker on first request: 202 with Retry-After until they are ready",
            ),
            OpenApiParameter(
                "Retry-After",
                int,
                location=OpenApiParameter.HEADER,
                response=[202],
                description="seconds to wait before asking again",
            ),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            (200, "application/zip"): OpenApiTypes.BINARY,
            202: inline_serializer(
                "ModelExportPending",
                {
                    "status": serializers.CharField(help_text="exporting"),
                    "format": serializers.CharField(),
                    "model_hash": serializers.CharField(),
                    "retry_after": serializers.IntegerField(help_text="seconds"),
                    "detail": serializers.CharField(),
                },
            ),
            **errors(400, 409),
        },
    )
    def get(self, request: Request, pk: str) -> HttpResponse:
        from marketplace.jobs.export import Pending, job_model_download

        job = self.job(request, pk)
        download = job_model_download(job, request.query_params.get("format", "safetensors"))
        if isinstance(download, Pending):  # a worker is making it: ask again later
            body = {"status": "exporting", "format": download.format,
                    "model_hash": download.model_hash, "retry_after": download.retry_after,
                    "detail": download.detail}  # fmt: skip
            return Response(
                body, status=status.HTTP_202_ACCEPTED,
                headers={"Retry-After": str(download.retry_after)},
            )  # fmt: skip
        response = HttpResponse(download.data, content_type=download.content_type)
        response["Content-Disposition"] = f'attachment; filename="{download.filename}"'
        response["X-GPUFlex-Model-Hash"] = job.model_hash
        return response


class JobPredictionsView(BuyerView):
    @extend_schema(
        responses={(200, "application/vnd.apache.parquet"): OpenApiTypes.BINARY, **errors(409)},
        description="An inference job's predictions, one Parquet row per dataset row in the "
        "dataset's order: row, prediction (the class index) and prob_<k> per class.",
    )
    def get(self, request: Request, pk: str) -> HttpResponse:
        from marketplace.rounds.scoring import predictions_file

        job = self.job(request, pk)
        response = HttpResponse(
            predictions_file(job), content_type="application/vnd.apache.parquet"
        )
        response["Content-Disposition"] = f'attachment; filename="predictions-{job.pk}.parquet"'
        return response


class JobTrackingView(BuyerView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: str) -> Response:
        """What the trackers log for this job: the spec as params, and per finished round
        accuracy, loss, nodes, upload_bytes and cost (charged so far)."""
        job = self.job(request, pk)
        record = job_record(job)
        rounds = [{"step": r.step, "metrics": r.metrics} for r in record.rounds]
        return Response({"job": record.job_id, "name": record.name, "params": record.params,
                         "rounds": rounds})  # fmt: skip


class JobAnchorsView(BuyerView):
    """Where the job's provenance is anchored on chain: the registry, the job's bytes32 key,
    and each anchored round's record hash and transaction (`gpuflex verify` checks them)."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def get(self, request: Request, pk: str) -> Response:
        job = self.job(request, pk)
        from django.conf import settings

        if not settings.CHAIN["URL"]:
            raise Conflict("The chain is disabled on this marketplace (GPUFLEX_CHAIN_URL).")
        from marketplace.ledger.chain import chain_client

        client = chain_client()
        anchors = [
            {
                "round": a.round,
                "record_hash": a.record_hash,
                "head": a.head,
                "anchored": a.anchored,
                "tx_hash": a.tx_hash,
                "block_number": a.block_number,
                "failed": a.failed,
            }
            for a in job.anchors.order_by("round")
        ]
        return Response(
            {
                "job": str(job.pk),
                "job_key": "0x" + job.pk.int.to_bytes(32, "big").hex(),
                "chain_id": int(client.w3.eth.chain_id) if client else None,
                "provenance_registry": client.deployment.provenance if client else "",
                "model_hash": job.model_hash,
                "anchors": anchors,
            }
        )


class JobProvenanceView(BuyerView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def get(self, request: Request, pk: str) -> HttpResponse:
        job = self.job(request, pk)
        if not job.rounds_done:
            raise Conflict("No round has finished yet, so there is no provenance record.")
        record = files.get(files.provenance_name(job.pk))
        return HttpResponse(record, content_type="application/json")


# one Server-Sent Events message of the stream: `data` is the job as GET jobs/{id}/, in JSON
JOB_EVENT = inline_serializer(
    name="JobEvent",
    fields={
        "event": serializers.CharField(help_text="state"),
        "data": serializers.CharField(help_text="the job, as GET jobs/{id}/ gives it, JSON"),
        "id": serializers.CharField(help_text="the message's number in this stream"),
    },
)


class JobEventsView(BuyerView):
    # the stream writes its own frames; anything DRF renders here (an error before the stream
    # starts) is JSON, whatever the Accept header or ?format= asks for
    renderer_classes = [JSONRenderer]
    content_negotiation_class = FormatIsTheModelFormat

    @extend_schema(responses={(200, CONTENT_TYPE): JOB_EVENT, **errors(503)})
    def get(self, request: Request, pk: str) -> HttpResponse:
        """Server-Sent Events: the job (as `GET jobs/{id}/`) once at once, then each time it
        changes (a lease, an upload, a round closing, a status change), as `event: state`
        messages. The stream ends after the job ends, or after a few minutes (reconnect);
        503 when the server holds all the streams it may (poll `GET jobs/{id}/` instead)."""
        job = self.job(request, pk)
        own = jobs_of(request.user)

        def render() -> dict:
            return dict(JobDetailSerializer(own.get(pk=job.pk)).data)

        return event_stream(
            [topics.job(job.pk)], render, done=lambda state: state["status"] not in ACTIVE_STATUSES
        )
