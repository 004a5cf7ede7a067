"""Chunked, resumable uploads (marketplace/uploads): in order or refused, resumed after a
dropped chunk, checked by size and sha256 on finish, within quota, cleaned when stale, and
used by a job submission in place of an inline dataset. Real PostgreSQL when it runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.rounds.maintenance import tick
from marketplace.uploads import partial
from marketplace.uploads.models import Upload, UploadStatus
from marketplace.uploads.services import write_chunk
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.usefixtures("own_media", "own_upload_dir")


@pytest.fixture
def own_upload_dir(tmp_path, settings) -> Path:
    settings.GPUFLEX = settings.GPUFLEX | {"UPLOAD_DIR": str(tmp_path / "uploads")}
    return tmp_path / "uploads"


def media_files() -> list[str]:
    media = settings.MEDIA_ROOT
    return sorted(
        os.path.relpath(os.path.join(d, f), media) for d, _, fs in os.walk(media) for f in fs
    )


def payload(n: int = 1000) -> bytes:
    return bytes(range(256)) * (n // 256) + bytes(range(n % 256))


def create(client, data: bytes, name: str = "data.bin", sha: str | None = None):
    body = {"filename": name, "size": len(data), "sha256": sha or hashlib.sha256(data).hexdigest()}
    return client.post("/api/v1/uploads/", body, format="json")


def put(client, upload_id: str, data: bytes, start: int, end: int, total: int):
    return client.generic(
        "PUT",
        f"/api/v1/uploads/{upload_id}/",
        data[start : end + 1],
        content_type="application/octet-stream",
        HTTP_CONTENT_RANGE=f"bytes {start}-{end}/{total}",
    )


def finish(client, upload_id: str):
    return client.post(f"/api/v1/uploads/{upload_id}/finish")


def send_all(client, upload_id: str, data: bytes, chunk: int = 300) -> None:
    for start in range(0, len(data), chunk):
        end = min(start + chunk, len(data)) - 1
        assert put(client, upload_id, data, start, end, len(data)).status_code == 200


def test_chunks_in_order_then_finish_stores_the_file(buyer) -> None:
    data = payload(1000)
    # (binary: not named .csv, which would be refused at its first chunk as not UTF-8)
    up = create(buyer, data, "my data.npz").json()
    assert up["status"] == "open" and up["received"] == 0 and up["filename"] == "my_data.npz"
    send_all(buyer, up["id"], data)
    assert media_files() == []  # nothing in storage before the file is checked
    done = finish(buyer, up["id"])
    assert done.status_code == 200, done.content
    assert done.json()["status"] == "complete"
    stored = Upload.objects.get(pk=up["id"]).stored_name
    assert media_files() == [stored]
    assert Path(settings.MEDIA_ROOT, stored).read_bytes() == data
    assert not partial.partial_path(up["id"]).exists()  # moved, not copied
    assert finish(buyer, up["id"]).json()["status"] == "complete"  # a retried finish


def test_a_dropped_chunk_keeps_nothing_and_the_upload_resumes(buyer, make_user) -> None:
    data = payload(1000)
    up = create(buyer, data).json()
    assert put(buyer, up["id"], data, 0, 399, 1000).status_code == 200

    class Dropped(io.BytesIO):
        """A request body whose connection goes away after 150 of its 400 bytes."""

        def read(self, n: int = -1) -> bytes:
            if self.tell() >= 150:
                raise OSError("connection reset by peer")
            return super().read(min(n, 150 - self.tell()))

    owner = Upload.objects.get(pk=up["id"]).owner
    with pytest.raises(Exception) as caught:
        write_chunk(owner=owner, upload_id=up["id"], content_range="bytes 400-799/1000",
                    content_length=None, stream=Dropped(data[400:800]))  # fmt: skip
    assert getattr(caught.value, "code", "") == "bad_chunk"
    assert "150 of its 400 bytes" in str(caught.value)
    # the session says where to resume, and the partial file holds exactly that
    state = buyer.get(f"/api/v1/uploads/{up['id']}/").json()
    assert state["received"] == 400
    assert partial.partial_path(up["id"]).read_bytes() == data[:400]
    assert put(buyer, up["id"], data, 400, 999, 1000).status_code == 200
    assert finish(buyer, up["id"]).json()["status"] == "complete"
    stored = Upload.objects.get(pk=up["id"]).stored_name
    assert Path(settings.MEDIA_ROOT, stored).read_bytes() == data


def test_out_of_order_and_overlapping_chunks_are_refused(buyer) -> None:
    data = payload(1000)
    up = create(buyer, data).json()
    assert put(buyer, up["id"], data, 0, 499, 1000).status_code == 200
    for start, end in ((600, 799), (400, 699), (0, 499)):  # a gap, an overlap, a repeat
        r = put(buyer, up["id"], data, start, end, 1000)
        assert r.status_code == 409, r.content
        assert r.json()["error"] == "chunk_out_of_order" and r.json()["received"] == 500
        assert "byte 500" in r.json()["detail"]
    bad = [
        ("bytes 500-400/1000", "before its start"),
        ("bytes 500-999/999", "declared 1000"),
        ("bytes 500-1000/1000", "past the file's last byte"),
        ("500-999", "Content-Range header like"),
    ]
    for header, words in bad:
        span = header.partition("/")[0].split()[-1].split("-")
        body = b"x" * max(1, int(span[-1]) - int(span[0]) + 1)
        r = buyer.generic(
            "PUT", f"/api/v1/uploads/{up['id']}/", body,
            content_type="application/octet-stream", HTTP_CONTENT_RANGE=header,
        )  # fmt: skip
        assert r.status_code == 400 and words in r.json()["detail"], (header, r.content)
    # a body shorter than its range says (Content-Length differs): refused before writing
    r = buyer.generic("PUT", f"/api/v1/uploads/{up['id']}/", data[500:600],
                      content_type="application/octet-stream",
                      HTTP_CONTENT_RANGE="bytes 500-999/1000")  # fmt: skip
    assert r.status_code == 400 and "100 bytes but Content-Range spans 500" in r.json()["detail"]
    assert partial.partial_path(up["id"]).read_bytes() == data[:500]
    assert Upload.objects.get(pk=up["id"]).received == 500


def test_finishing_with_missing_bytes_says_how_many_and_keeps_the_session(buyer) -> None:
    data = payload(1000)
    up = create(buyer, data).json()
    assert put(buyer, up["id"], data, 0, 699, 1000).status_code == 200
    r = finish(buyer, up["id"])
    assert r.status_code == 400 and r.json()["error"] == "incomplete_upload"
    assert "300 bytes are missing" in r.json()["detail"] and r.json()["received"] == 700
    assert media_files() == []
    assert put(buyer, up["id"], data, 700, 999, 1000).status_code == 200
    assert finish(buyer, up["id"]).status_code == 200


def test_a_wrong_hash_discards_the_upload(buyer) -> None:
    data = payload(1000)
    up = create(buyer, data, sha=hashlib.sha256(b"other").hexdigest()).json()
    send_all(buyer, up["id"], data)
    r = finish(buyer, up["id"])
    assert r.status_code == 400 and r.json()["error"] == "hash_mismatch"
    assert hashlib.sha256(data).hexdigest() in r.json()["detail"]
    assert not Upload.objects.exists() and media_files() == []
    assert not partial.partial_path(up["id"]).exists()
    assert buyer.get(f"/api/v1/uploads/{up['id']}/").status_code == 404


def test_quota_and_size_limits_refuse_before_any_byte(buyer, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"UPLOAD_QUOTA_BYTES": 1500, "MAX_UPLOAD_BYTES": 1200}
    first = create(buyer, payload(1000))
    assert first.status_code == 201
    r = create(buyer, payload(600))
    assert r.status_code == 413 and r.json()["error"] == "over_quota"
    assert r.json()["used"] == 1000 and r.json()["quota"] == 1500
    r = create(buyer, payload(1300))
    assert r.status_code == 413 and r.json()["error"] == "too_large"
    assert Upload.objects.count() == 1
    # deleting the open upload gives its share of the quota back
    assert buyer.delete(f"/api/v1/uploads/{first.json()['id']}/").status_code == 204
    assert create(buyer, payload(600)).status_code == 201
    r = create(buyer, b"", sha="0" * 64)
    assert r.status_code == 400  # an empty file is no dataset


def test_another_buyers_upload_is_not_found(buyer, make_user) -> None:
    from tests.marketplace.helpers import client_for

    up = create(buyer, payload(100)).json()
    other = client_for(make_user("buyer")[1])
    assert other.get(f"/api/v1/uploads/{up['id']}/").status_code == 404
    assert put(other, up["id"], payload(100), 0, 99, 100).status_code == 404
    assert other.get("/api/v1/uploads/").json()["results"] == []


def test_the_tick_removes_stale_sessions_and_unused_files(
    buyer, django_capture_on_commit_callbacks
) -> None:
    data = payload(1000)
    stale, fresh, unused = (create(buyer, data).json() for _ in range(3))
    for up in (stale, fresh):
        assert put(buyer, up["id"], data, 0, 99, 1000).status_code == 200
    send_all(buyer, unused["id"], data)
    assert finish(buyer, unused["id"]).status_code == 200
    old = timezone.now() - timedelta(seconds=settings.GPUFLEX["UPLOAD_STALE_S"] + 1)
    Upload.objects.filter(pk=stale["id"]).update(updated_at=old)
    assert tick()["uploads"] == 1  # only the stale one's time has come
    assert not Upload.objects.filter(pk=stale["id"]).exists()
    orphan = partial.partial_path("0" * 8 + "-0000-0000-0000-" + "0" * 12)
    orphan.write_bytes(b"left by a crash")
    os.utime(orphan, (old.timestamp(), old.timestamp()))
    kept = timezone.now() - timedelta(seconds=settings.GPUFLEX["UPLOAD_KEEP_S"] + 1)
    Upload.objects.filter(pk=unused["id"]).update(completed_at=kept)
    with django_capture_on_commit_callbacks(execute=True):
        assert tick()["uploads"] == 2  # the unused file and the orphan
    assert list(Upload.objects.values_list("pk", flat=True)) == [
        Upload.objects.get(pk=fresh["id"]).pk
    ]
    assert media_files() == [] and not orphan.exists()
    assert partial.partial_path(fresh["id"]).read_bytes() == data[:100]


def csv_bytes(rows: int = 60) -> bytes:
    lines = ["a,b,label"] + [f"{i * 0.1:.2f},{(i % 7) * 0.3:.2f},{i % 2}" for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def csv_spec() -> str:
    spec = SMALL_SPEC | {
        "dataset": {"kind": "csv", "path": "data.csv"},
        "sharding": {"method": "stratified", "num_shards": 2},
    }
    return json.dumps(spec)


def submit_with(client, upload_id: str, **extra):
    body = {"spec": csv_spec(), "budget": "10", "max_price_per_gpu_hour": "1.00"}
    return client.post("/api/v1/jobs/", body | {"dataset_upload": upload_id} | extra,
                       format="multipart")  # fmt: skip


def finished(client, data: bytes, name: str = "big.csv") -> str:
    up = create(client, data, name).json()
    send_all(client, up["id"], data, chunk=512)
    assert finish(client, up["id"]).status_code == 200
    return up["id"]


def test_a_job_takes_a_finished_upload_as_its_dataset(
    buyer, django_capture_on_commit_callbacks
) -> None:
    data = csv_bytes()
    upload_id = finished(buyer, data)
    stored = Upload.objects.get(pk=upload_id).stored_name
    with django_capture_on_commit_callbacks(execute=True):
        r = submit_with(buyer, upload_id)
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert job.spec["dataset"]["path"] == "big.csv"
    assert Path(settings.MEDIA_ROOT, job.dataset_file).read_bytes() == data
    assert job.shards.count() == 2
    upload = Upload.objects.get(pk=upload_id)
    assert upload.status == UploadStatus.USED and upload.job_id == job.pk
    assert stored not in media_files()  # the job holds its own copy; the quota is freed
    again = submit_with(buyer, upload_id)
    assert again.status_code == 400 and "used by a job already" in again.json()["detail"]


def test_submission_checks_the_uploads_format_and_state(buyer, make_user) -> None:
    from tests.marketplace.helpers import client_for

    bad = finished(buyer, b"a,b,label\n1,2,0\n3,x,1\n")  # 'x': found at submission
    r = submit_with(buyer, bad)
    assert r.status_code == 400 and r.json()["error"] == "invalid_dataset", r.content
    assert Upload.objects.get(pk=bad).status == UploadStatus.COMPLETE  # kept: nothing used
    assert not Job.objects.exists()

    data = csv_bytes()
    up = create(buyer, data).json()
    assert put(buyer, up["id"], data, 0, 99, len(data)).status_code == 200
    r = submit_with(buyer, up["id"])
    assert r.status_code == 400 and "not finished (100 of" in r.json()["detail"]

    other = client_for(make_user("buyer")[1])
    assert submit_with(other, finished(buyer, data, "x.csv")).status_code == 404

    both = {"dataset": io.BytesIO(data)}
    r = submit_with(buyer, finished(buyer, csv_bytes(61)), **both)
    assert r.status_code == 400 and "not both" in r.json()["detail"]
    assert not Job.objects.exists()


def test_a_csv_is_refused_at_its_first_chunk_and_its_bytes_removed(buyer, own_upload_dir) -> None:
    """#37 item 4: a 1 GiB CSV with an over-long field was uploaded whole before it was
    refused, and its bytes stayed for days."""
    import csv

    limit = csv.field_size_limit()
    data = b"a,b,label\n1," + b"9" * (limit + 10) + b",0\n" + csv_bytes(20_000)[10:]
    up = create(buyer, data, "big.csv").json()
    first = 256 * 1024  # of 600 kB: the rest is never sent
    r = put(buyer, up["id"], data, 0, first - 1, len(data))
    assert r.status_code == 400 and r.json()["error"] == "invalid_dataset", r.content
    detail = r.json()["detail"]
    assert "refused at its first chunk and its bytes removed" in detail
    assert f"big.csv: cannot read CSV: field larger than field limit ({limit})" in detail
    assert not Upload.objects.filter(pk=up["id"]).exists()
    assert not partial.partial_path(up["id"]).exists() and list(own_upload_dir.iterdir()) == []
    assert buyer.get(f"/api/v1/uploads/{up['id']}/").status_code == 404

    # a row whose width is not the header's, and a header naming a column twice
    narrow = b"a,b,label\n1,2,0\n1,2\n" + csv_bytes()
    twice = b"a,a,label\n" + csv_bytes()[10:]
    for bad, said in ((narrow, "row 2 has 2 fields"), (twice, "duplicate column names ['a']")):
        up = create(buyer, bad, "rows.csv").json()
        r = put(buyer, up["id"], bad, 0, 99, len(bad))
        assert r.status_code == 400 and said in r.json()["detail"], r.content
        assert not Upload.objects.filter(pk=up["id"]).exists()


def test_a_good_csv_cut_anywhere_passes_its_first_chunk(buyer) -> None:
    # a quoted field with a newline, cut inside it: only whole records are judged
    data = b'a,b,label\n1,2,"x\ny"\n' + csv_bytes()[10:]
    for cut in (12, 16, 18, 40):
        up = create(buyer, data, f"cut{cut}.csv").json()
        assert put(buyer, up["id"], data, 0, cut - 1, len(data)).status_code == 200
    other = create(buyer, payload(), "data.bin").json()  # not a CSV: judged when used
    assert put(buyer, other["id"], payload(), 0, 99, 1000).status_code == 200
