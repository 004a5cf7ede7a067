"""Buyers: submit, list, inspect, control and download jobs. Other buyers' jobs are 404."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.parsers import FormParser, MultiPartParser
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
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict
from marketplace.jobs.models import Job
from marketplace.jobs.selectors import jobs_of
from marketplace.jobs.services import cancel_job, pause_job, resume_job
from marketplace.jobs.submission import submit_job
from marketplace.rounds.aggregation import provenance_name
from marketplace.rounds.selectors import rounds_of


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
        return jobs_of(self.request.user).order_by("-created_at")

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer, **errors(402, 413)})
    def post(self, request: Request) -> Response:
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        job = submit_job(
            buyer=request.user,
            spec_data=data["spec"],
            dataset_upload=data.get("dataset"),
            tier=data["tier"],
            budget=data["budget"],
            max_price_per_gpu_hour=data["max_price_per_gpu_hour"],
            federated_dataset=data["federated_dataset"],
        )
        job = jobs_of(request.user).get(pk=job.pk)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)


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


class JobModelView(BuyerView):
    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **errors(409)}
    )
    def get(self, request: Request, pk: str) -> HttpResponse:
        job = self.job(request, pk)
        if not job.model_file:
            raise Conflict("No round has finished yet, so there is no model to download.")
        response = HttpResponse(files.get(job.model_file), content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="{job.pk}.safetensors"'
        response["X-GPUFlex-Model-Hash"] = job.model_hash
        return response


class JobProvenanceView(BuyerView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def get(self, request: Request, pk: str) -> HttpResponse:
        job = self.job(request, pk)
        if not job.rounds_done:
            raise Conflict("No round has finished yet, so there is no provenance record.")
        return HttpResponse(files.get(provenance_name(job)), content_type="application/json")
