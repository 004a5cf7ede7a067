"""Downloads sent gzip-encoded where the agent accepts it and it pays.

Shards are dense arrays whose values repeat (pixels, token ids), so gzip cuts them several
fold (digits: 76 kB to 11 kB); models and deltas barely shrink, and are sent as they are when
compression would save less than MIN_SAVING. The traffic counters record what went on the wire.
"""

from __future__ import annotations

import gzip

from django.http import HttpResponse
from django.utils.cache import patch_vary_headers
from rest_framework.request import Request

MIN_BYTES = 1024  # below this, gzip's own header and the CPU are not worth it
MIN_SAVING = 0.125  # send compressed only when it saves at least an eighth
LEVEL = 6  # zlib's default: most of level 9's ratio at a fraction of its time


def accepts_gzip(request: Request) -> bool:
    accepted = request.headers.get("Accept-Encoding", "")
    return any(part.split(";")[0].strip().lower() == "gzip" for part in accepted.split(","))


def encoded_response(request: Request, data: bytes, content_type: str) -> HttpResponse:
    """`data` as the response body, gzip-encoded when the agent accepts it and it saves
    enough; `len(response.content)` is the bytes on the wire."""
    body, encoded = data, False
    if len(data) >= MIN_BYTES and accepts_gzip(request):
        packed = gzip.compress(data, compresslevel=LEVEL, mtime=0)
        if len(packed) <= len(data) * (1 - MIN_SAVING):
            body, encoded = packed, True
    response = HttpResponse(body, content_type=content_type)
    if encoded:
        response["Content-Encoding"] = "gzip"
    patch_vary_headers(response, ("Accept-Encoding",))
    return response
