"""The submit page's chunked uploads (static/web/js/upload.js): the same sessions and rules
as /api/v1/uploads/ (marketplace/uploads), for a signed-in buyer's browser session, CSRF
checked. Answers are JSON: the upload, or {"error", "detail"} with the service's 4xx."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.jobs.errors import MarketplaceError
from marketplace.numbers import header_length, whole_number
from marketplace.uploads.models import Upload
from marketplace.uploads.selectors import upload_of
from marketplace.uploads.services import create_upload, finish_upload, write_chunk
from marketplace.web.access import buyer_required
from trainer.nesting import TooDeep, loads_json


def _json(upload: Upload, status: int = 200) -> JsonResponse:
    fields = ("filename", "size", "sha256", "received", "status")
    body = {"id": str(upload.pk)} | {f: getattr(upload, f) for f in fields}
    return JsonResponse(body, status=status)


def _error(exc: MarketplaceError) -> JsonResponse:
    return JsonResponse({"error": exc.code, "detail": exc.detail, **exc.extra}, status=exc.status)


@buyer_required
@require_POST
def upload_new(request: HttpRequest) -> HttpResponse:
    try:
        body = loads_json(request.body.decode("utf-8", errors="replace"))
        upload = create_upload(
            owner=request.user,
            filename=str(body["filename"]),
            size=whole_number(body["size"]),  # the digits 0-9 only
            sha256=str(body["sha256"]),
        )
    except (ValueError, KeyError, TypeError, TooDeep):
        return JsonResponse({"error": "invalid", "detail": "Send JSON with filename, size "
                             "and sha256."}, status=400)  # fmt: skip
    except MarketplaceError as exc:
        return _error(exc)
    return _json(upload, 201)


@buyer_required
@require_http_methods(["GET", "PUT"])
def upload_chunk(request: HttpRequest, pk: str) -> HttpResponse:
    try:
        if request.method == "GET":
            return _json(upload_of(request.user, pk))
        length = request.META.get("CONTENT_LENGTH")
        upload = write_chunk(
            owner=request.user,
            upload_id=pk,
            content_range=request.headers.get("Content-Range"),
            content_length=header_length(length),
            stream=request,  # read straight from the request, a piece at a time
        )
    except MarketplaceError as exc:
        return _error(exc)
    return _json(upload)


@buyer_required
@require_POST
def upload_finish(request: HttpRequest, pk: str) -> HttpResponse:
    try:
        return _json(finish_upload(owner=request.user, upload_id=pk))
    except MarketplaceError as exc:
        return _error(exc)
