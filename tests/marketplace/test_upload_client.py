"""The SDK's and the CLI's side of chunked uploads, through the real app: progress reported,
a dropped connection resumed from the server's offset, an interrupted run resumed by the
next, and `gpuflex submit` taking the chunked path above the threshold with a progress bar."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.db import connection

from marketplace import cli
from marketplace import client as sdk
from marketplace.accounts.models import User
from marketplace.client import Client
from marketplace.jobs.models import Job
from marketplace.uploads import partial
from marketplace.uploads.errors import ChunkOutOfOrder
from marketplace.uploads.models import Upload, UploadStatus
from marketplace.uploads.services import create_upload, write_chunk
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("own_media", "own_upload_dir"),
]


@pytest.fixture
def own_upload_dir(tmp_path, settings) -> Path:
    settings.GPUFLEX = settings.GPUFLEX | {"UPLOAD_DIR": str(tmp_path / "uploads")}
    return tmp_path / "uploads"


class Flaky(httpx.BaseTransport):
    """The app over WSGI, with chunk PUTs failing as told: `lose_answer` PUTs reach the
    server but their answer is lost; `drop` PUTs never reach it (None: all from then on)."""

    def __init__(self, lose_answer: set[int] = frozenset(), drop_from: int | None = None) -> None:
        self.app = httpx.WSGITransport(app=get_wsgi_application())
        self.lose_answer, self.drop_from = lose_answer, drop_from
        self.puts: list[str] = []  # the Content-Range of every chunk the server was sent

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            n = len(self.puts) + 1
            if self.drop_from is not None and n >= self.drop_from:
                raise httpx.WriteError("connection reset by peer")
            self.puts.append(request.headers["Content-Range"])
            response = self.app.handle_request(request)
            if n in self.lose_answer:
                raise httpx.ReadError("connection reset by peer")
            return response
        return self.app.handle_request(request)


@pytest.fixture
def key(make_user) -> str:
    return make_user("buyer")[1]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch) -> None:
    monkeypatch.setattr(sdk, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(sdk, "CHUNKED_ABOVE", 10_000)
    monkeypatch.setattr(sdk, "RETRY_WAIT_S", 0.0)


def csv_file(path: Path, rows: int = 2000) -> Path:
    lines = ["a,b,label"] + [f"{i * 0.01:.3f},{(i % 7) * 0.3:.2f},{i % 2}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_upload_reports_progress_and_resumes_after_lost_answers(key, tmp_path) -> None:
    data = csv_file(tmp_path / "d.csv")
    size = data.stat().st_size
    flaky = Flaky(lose_answer={2, 3})  # chunk 2 arrived, its answer lost; so did 3's retry
    seen: list[tuple[int, int]] = []
    with Client("http://testserver", key, transport=flaky) as client:
        up = client.upload(data, progress=lambda done, total: seen.append((done, total)))
    assert up["status"] == "complete" and up["size"] == size
    stored = Path(settings.MEDIA_ROOT, Upload.objects.get(pk=up["id"]).stored_name)
    assert stored.read_bytes() == data.read_bytes()
    # no chunk was sent twice: after a lost answer the client asked where the server stood
    assert len(flaky.puts) == len(set(flaky.puts)) == -(-size // 4096)
    assert seen[0] == (0, size) and seen[-1] == (size, size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_an_interrupted_run_is_resumed_by_the_next(key, tmp_path) -> None:
    data = csv_file(tmp_path / "d.csv")
    size = data.stat().st_size
    dropped = Client("http://testserver", key, transport=Flaky(drop_from=4))
    with dropped as client, pytest.raises(httpx.TransportError):
        client.upload(data)
    assert Upload.objects.get().received == 3 * 4096
    healthy = Flaky()
    with Client("http://testserver", key, transport=healthy) as client:
        up = client.upload(data)
        assert up["status"] == "complete"
        assert healthy.puts[0] == f"bytes {3 * 4096}-{4 * 4096 - 1}/{size}"  # not from 0
        assert client.upload(data)["id"] == up["id"]  # finished and unused: reused as is
    assert Upload.objects.count() == 1


def spec_file(tmp_path: Path) -> Path:
    spec = SMALL_SPEC | {
        "dataset": {"kind": "csv", "path": "big.csv"},
        "sharding": {"method": "stratified", "num_shards": 2},
        "rounds": {"max_rounds": 1},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    return path


def test_cli_submit_uploads_a_large_dataset_in_chunks_with_a_progress_bar(
    key, tmp_path, monkeypatch, capsys
) -> None:
    data = csv_file(tmp_path / "big.csv")
    transports = [Flaky(drop_from=3), Flaky()]
    monkeypatch.setattr(
        cli, "build_client",
        lambda args: Client("http://testserver", key, transport=transports.pop(0)),
    )  # fmt: skip
    argv = ["submit", str(spec_file(tmp_path)), "--dataset", str(data), "--budget", "10"]
    assert cli.main(argv) == 2  # the link went down for good
    err = capsys.readouterr().err
    assert "uploading big.csv" in err and "cannot reach the marketplace" in err
    assert not Job.objects.exists()
    assert cli.main(argv) == 0  # run again: resumed, finished, submitted
    out = capsys.readouterr()
    assert "uploading big.csv" in out.err and "100%" in out.err
    job = Job.objects.get(pk=out.out.split()[1])
    assert Path(settings.MEDIA_ROOT, job.dataset_file).read_bytes() == data.read_bytes()
    upload = Upload.objects.get()
    assert upload.status == UploadStatus.USED and upload.job_id == job.pk
    assert upload.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()


def test_cli_upload_command_and_small_datasets_go_inline(key, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        cli, "build_client", lambda args: Client("http://testserver", key, transport=Flaky())
    )
    data = csv_file(tmp_path / "big.csv")
    assert cli.main(["upload", str(data)]) == 0
    out = capsys.readouterr()
    assert f"({data.stat().st_size} bytes" in out.out and "100%" in out.err
    small = csv_file(tmp_path / "small.csv", rows=100)
    argv = ["submit", str(spec_file(tmp_path)), "--dataset", str(small), "--budget", "10"]
    assert cli.main(argv) == 0
    assert "uploading" not in capsys.readouterr().err  # inline: no chunks, no bar
    assert Upload.objects.count() == 1


def test_a_dataset_over_the_servers_inline_limit_goes_chunked_after_its_413(
    key, tmp_path, settings
) -> None:
    """The SDK's threshold is its own guess; a server with a lower inline limit answers
    413 too_large, and the dataset goes in chunks instead."""
    settings.GPUFLEX = settings.GPUFLEX | {"MAX_DATASET_BYTES": 20_000}
    data = csv_file(tmp_path / "big.csv")
    assert 20_000 < data.stat().st_size < 10**6
    with Client("http://testserver", key, transport=Flaky()) as client:
        job = client.submit(spec_file(tmp_path), dataset=data, budget="10",
                            chunked_above=10**6)  # fmt: skip
    assert Upload.objects.get().job_id == Job.objects.get(pk=job["id"]).pk


def test_two_chunks_at_once_for_one_offset_write_one(key, tmp_path) -> None:
    """A client retrying a chunk whose first attempt is still being written (mid-body,
    holding the session's row lock): the retry is refused with the offset the first one
    reached, whenever it gets the lock, and the file holds the chunk once."""
    owner = User.objects.get()  # the buyer whose key the fixture made
    data = b"abcdefgh" * 512
    up = create_upload(owner=owner, filename="d.bin", size=len(data),
                       sha256=hashlib.sha256(data).hexdigest())  # fmt: skip
    reading, release = threading.Event(), threading.Event()

    class Held:
        """A body that stops halfway until the test releases it (the lock is held)."""

        def __init__(self) -> None:
            self.sent = 0

        def read(self, n: int) -> bytes:
            if self.sent == 1024:
                reading.set()
                release.wait()
            piece = data[self.sent : min(self.sent + n, self.sent + 1024, 2048)]
            self.sent += len(piece)
            return piece

    results: dict[str, object] = {}

    def send(name: str, stream: object) -> None:
        try:
            done = write_chunk(owner=owner, upload_id=up.pk, content_range="bytes 0-2047/4096",
                               content_length=2048, stream=stream)  # fmt: skip
            results[name] = ("written", done.received)
        except ChunkOutOfOrder as exc:
            results[name] = ("refused", exc.extra["received"])
        finally:
            connection.close()

    first = threading.Thread(target=send, args=("first", Held()))
    first.start()
    assert reading.wait(30)  # the first holds the row lock, mid-body
    second = threading.Thread(target=send, args=("second", io.BytesIO(data[:2048])))
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert results == {"first": ("written", 2048), "second": ("refused", 2048)}
    assert partial.partial_path(up.pk).read_bytes() == data[:2048]
