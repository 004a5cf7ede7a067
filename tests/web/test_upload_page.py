"""The submit page's chunked upload: its endpoints under the browser session (CSRF checked,
buyers only), a job submitted with the finished upload's id, and upload.js's SHA-256
checked against Python's under node (when node is installed)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret
from django.test import Client

from marketplace.jobs.models import Job
from marketplace.uploads.models import Upload, UploadStatus
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_media", "own_upload_dir")]
UPLOAD_JS = Path(__file__).resolve().parents[2] / "marketplace/web/static/web/js/upload.js"


@pytest.fixture
def own_media(tmp_path, settings) -> None:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.STORAGES = settings.STORAGES | {"default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": settings.MEDIA_ROOT}}}  # fmt: skip


@pytest.fixture
def own_upload_dir(tmp_path, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"UPLOAD_DIR": str(tmp_path / "uploads")}


def csrf_client(user) -> tuple[Client, str]:
    """A logged-in browser that must send the CSRF token, as the page's script does."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    return client, _mask_cipher_secret(secret)


def data_csv() -> bytes:
    lines = ["a,b,label"] + [f"{i * 0.1:.2f},{(i % 5) * 0.2:.2f},{i % 2}" for i in range(80)]
    return ("\n".join(lines) + "\n").encode()


def test_the_page_uploads_in_chunks_and_submits_by_id(make_user) -> None:
    client, token = csrf_client(make_user("buyer"))
    page = client.get("/jobs/new/").content.decode()
    assert 'data-upload-url="/uploads/"' in page and "web/js/upload.js" in page
    assert 'name="dataset_upload"' in page
    data = data_csv()
    meta = {"filename": "rows.csv", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    refused = client.post("/uploads/", json.dumps(meta), content_type="application/json")
    assert refused.status_code == 403  # no CSRF token: refused like any form
    head = {"HTTP_X_CSRFTOKEN": token, "HTTP_ACCEPT": "application/json"}
    up = client.post("/uploads/", json.dumps(meta), content_type="application/json", **head)
    assert up.status_code == 201, up.content
    uid = up.json()["id"]
    half = len(data) // 2
    for start, end in ((0, half - 1), (half, len(data) - 1)):
        r = client.put(f"/uploads/{uid}/", data[start : end + 1],
                       content_type="application/octet-stream",
                       HTTP_CONTENT_RANGE=f"bytes {start}-{end}/{len(data)}", **head)  # fmt: skip
        assert r.status_code == 200, r.content
    again = client.put(f"/uploads/{uid}/", data[:10], content_type="application/octet-stream",
                       HTTP_CONTENT_RANGE=f"bytes 0-9/{len(data)}", **head)  # fmt: skip
    assert again.status_code == 409 and again.json()["received"] == len(data)
    assert client.get(f"/uploads/{uid}/", **head).json()["received"] == len(data)
    assert client.post(f"/uploads/{uid}/finish/", **head).json()["status"] == "complete"

    spec = SMALL_SPEC | {"dataset": {"kind": "csv", "path": "rows.csv"},
                         "sharding": {"method": "stratified", "num_shards": 2}}  # fmt: skip
    body = {"spec": yaml.safe_dump(spec), "tier": "hybrid", "budget": "5",
            "max_price_per_gpu_hour": "1.00", "dataset_upload": uid}  # fmt: skip
    ok = client.post("/jobs/new/", body, **head)
    assert ok.status_code == 201, ok.content
    job = Job.objects.get()
    assert job.spec["dataset"]["path"] == "rows.csv"
    assert Upload.objects.get(pk=uid).status == UploadStatus.USED


def test_upload_endpoints_are_for_buyers(make_user) -> None:
    client, token = csrf_client(make_user("provider"))
    head = {"HTTP_X_CSRFTOKEN": token}
    r = client.post("/uploads/", "{}", content_type="application/json", **head)
    assert r.status_code == 403
    assert Client().post("/uploads/", "{}", content_type="application/json").status_code == 302


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_upload_js_sha256_matches_python() -> None:
    script = """
    global.window = {};
    require(process.argv[1]);
    const h = new window.GPUFlexUpload.Sha256();
    const data = require("fs").readFileSync(0);
    for (let i = 0; i < data.length; i += 37) h.update(new Uint8Array(data.subarray(i, i + 37)));
    console.log(h.hex());
    """
    for n in (0, 55, 56, 64, 1000, 70_000):
        data = hashlib.sha256(str(n).encode()).digest() * (n // 32) + b"x" * (n % 32)
        out = subprocess.run(["node", "-e", script, str(UPLOAD_JS)], input=data,
                             capture_output=True, check=True)  # fmt: skip
        assert out.stdout.decode().strip() == hashlib.sha256(data).hexdigest(), n
