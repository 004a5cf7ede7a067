"""The upload errors the API turns into 4xx answers (see marketplace.jobs.errors)."""

from __future__ import annotations

from marketplace.jobs.errors import Conflict, MarketplaceError, TooLarge


class OverQuota(TooLarge):
    code = "over_quota"


class BadChunk(MarketplaceError):
    """A chunk whose Content-Range is malformed, past the declared size, or cut short."""

    code = "bad_chunk"


class ChunkOutOfOrder(Conflict):
    """Chunks go in order: a chunk must start exactly where the upload has reached. The
    answer says where (`received`), so that a client resumes from there."""

    code = "chunk_out_of_order"


class IncompleteUpload(MarketplaceError):
    code = "incomplete_upload"


class HashMismatch(MarketplaceError):
    code = "hash_mismatch"
