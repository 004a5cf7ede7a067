"""Image archives and text (plain, JSONL, with a tokenizer.json) through the marketplace: every
bad upload a 4xx naming the problem with nothing stored, good ones trained to completion by
agents (in-process test agents, tests/marketplace/agents.py) on shards cut from them."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from marketplace.jobs import files
from marketplace.jobs.dataset_files import tokenizer_name
from marketplace.jobs.datasets import job_dataset
from marketplace.jobs.models import Job
from tests.image_archives import class_members, png, zip_bytes
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from tests.marketplace.test_job_submission import nothing_stored
from tests.trainer.test_text_formats import LINES, bpe_tokenizer_json
from trainer.datasets import load_dataset
from trainer.spec import DatasetSpec

pytestmark = pytest.mark.usefixtures("own_media")

IMAGE_SPEC = SMALL_SPEC | {
    "name": "images",
    "dataset": {"kind": "image_folder", "path": "images.zip", "image_size": 8},
    "model": {"arch": "cnn", "channels": [4]},
    "sharding": {"method": "stratified", "num_shards": 2},
}
TEXT_SPEC = SMALL_SPEC | {
    "name": "text",
    "dataset": {"kind": "text", "path": "corpus.txt", "seq_len": 16},
    "model": {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2},
    "optimizer": {"name": "adam", "lr": 0.01},
    "local": {"steps": 4, "batch_size": 8},
    "sharding": {"method": "length", "num_shards": 2},
}


def post(buyer, spec: dict, dataset: tuple[str, bytes] | None, **uploads: tuple[str, bytes]):
    body = {"spec": json.dumps(spec), "max_price_per_gpu_hour": "1.00", "budget": "10",
            "tier": "platform"}  # fmt: skip
    if dataset is not None:
        body["dataset"] = SimpleUploadedFile(*dataset)
    body |= {field: SimpleUploadedFile(*upload) for field, upload in uploads.items()}
    return buyer.post("/api/v1/jobs/", body, format="multipart")


def refused(response, status: int, code: str, *words: str) -> None:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"] == code
    for word in words:
        assert word in body["detail"], body["detail"]
    assert "/tmp" not in body["detail"] and "gpuflex-upload" not in body["detail"]
    assert nothing_stored()


def tar_gz(members: dict[str, bytes], special: tarfile.TarInfo | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if special is not None:
            tf.addfile(special)
    return buf.getvalue()


# -- images -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["images.zip", "images.tar.gz"])
def test_an_image_archive_job_trains_to_completion(buyer, make_agent, name: str) -> None:
    members = class_members(12)
    data = zip_bytes(members) if name.endswith(".zip") else tar_gz(members)
    spec = IMAGE_SPEC | {"dataset": IMAGE_SPEC["dataset"] | {"path": name}}
    response = post(buyer, spec, (name, data))
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.input_shape == [3, 8, 8] and job.num_classes == 2
    assert job.spec["dataset"]["path"] == name
    assert job.dataset_file.endswith("/dataset" + name.removeprefix("images"))
    agents = [make_agent(kind="platform") for _ in range(2)]
    assert run_until_idle(agents) == 4  # 2 shards x 2 rounds
    job.refresh_from_db()
    assert job.status == "completed" and job.rounds_done == 2, job.error
    # the server's held-out split is the one gpuflex-sim makes from the same archive
    with files.local_copy(job.dataset_file) as path:
        local = load_dataset(DatasetSpec(kind="image_folder", path=str(path), image_size=8))
    assert job_dataset(job).x_test.equal(local.x_test)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("members", "status", "code", "words"),
    [
        ({"../evil.png": png(1)}, 400, "invalid_dataset", ["'../evil.png'", "climbs out"]),
        ({"/abs/x.png": png(1)}, 400, "invalid_dataset", ["'/abs/x.png'", "absolute path"]),
        ({"dark/readme.txt": b"hi"}, 400, "invalid_dataset", ["'dark/readme.txt'", "not an image"]),
        ({"dark/bomb.bmp": bytes(4 * 2**20)}, 413, "too_large", ["'dark/bomb.bmp'", "ratio"]),
    ],
)
def test_a_bad_zip_is_refused_by_name(buyer, members, status, code, words) -> None:
    data = zip_bytes(class_members(4) | members)
    refused(post(buyer, IMAGE_SPEC, ("images.zip", data)), status, code, "images.zip", *words)


@pytest.mark.django_db
def test_an_image_only_decoding_shows_bad_fails_the_job_in_the_worker(buyer) -> None:
    """The request lists the archive (no image decoded, no PIL in the web process: issue
    36); the worker that prepares the job decodes it and fails it naming the member."""
    from marketplace.jobs.models import JobStatus
    from marketplace.jobs.preparation import prepare_job

    data = zip_bytes(class_members(4) | {"dark/x.png": b"garbage"})
    response = post(buyer, IMAGE_SPEC, ("images.zip", data))
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert prepare_job(job.pk) is None
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "'dark/x.png'" in job.error and "not a readable" in job.error, job.error
    assert "images.zip" in job.error and "/tmp" not in job.error


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "words"),
    [(tarfile.SYMTYPE, ["is a link"]), (tarfile.LNKTYPE, ["is a link"]),
     (tarfile.CHRTYPE, ["not a regular file"])],
)  # fmt: skip
def test_tar_links_and_devices_are_refused(buyer, kind: bytes, words: list[str]) -> None:
    special = tarfile.TarInfo("dark/special.png")
    special.type, special.linkname = kind, "/etc/passwd"
    spec = IMAGE_SPEC | {"dataset": IMAGE_SPEC["dataset"] | {"path": "images.tar.gz"}}
    data = tar_gz(class_members(4), special)
    refused(post(buyer, spec, ("images.tar.gz", data)), 400, "invalid_dataset", *words)


@pytest.mark.django_db
def test_archive_limits_are_the_servers_settings(buyer, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {
        "IMAGE_ARCHIVE": settings.GPUFLEX["IMAGE_ARCHIVE"] | {"max_members": 5}
    }
    data = zip_bytes(class_members(4))
    refused(post(buyer, IMAGE_SPEC, ("images.zip", data)), 413, "too_large", "more than 5 members")


@pytest.mark.django_db
def test_one_class_and_a_non_archive_are_refused(buyer) -> None:
    one = {k: v for k, v in class_members(4).items() if k.startswith("light/")}
    response = post(buyer, IMAGE_SPEC, ("images.zip", zip_bytes(one)))
    refused(response, 400, "invalid_dataset", "only the class 'light'", "at least 2")
    response = post(buyer, IMAGE_SPEC, ("images.rar", b"Rar!"))
    refused(response, 400, "invalid_dataset", "'images.rar'", ".zip, .tar, .tar.gz, .tgz")


def test_an_assembled_file_of_any_name_is_checked_by_the_buyers_name(tmp_path) -> None:
    """What a chunked upload calls once its parts are joined, under a name of its own."""
    from marketplace.jobs.dataset_files import load_uploaded_dataset
    from marketplace.jobs.errors import InvalidDataset
    from trainer.spec import parse_spec

    part = tmp_path / "upload-7f3a.part"
    part.write_bytes(zip_bytes(class_members(4)))
    dataset = load_uploaded_dataset(parse_spec(IMAGE_SPEC), part, "photos.zip")
    assert dataset.num_classes == 2
    part.write_bytes(zip_bytes(class_members(4) | {"../x.png": png(1)}))
    with pytest.raises(InvalidDataset, match=r"photos.zip: member '../x.png' climbs out"):
        load_uploaded_dataset(parse_spec(IMAGE_SPEC), part, "photos.zip")


# -- text -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_text_job_with_a_tokenizer_trains_to_completion(buyer, make_agent) -> None:
    spec = TEXT_SPEC | {"dataset": TEXT_SPEC["dataset"] | {"tokenizer": "my-tokenizer.json"}}
    tokenizer = bpe_tokenizer_json(LINES).encode()
    response = post(buyer, spec, ("corpus.txt", "\n".join(LINES).encode()),
                    dataset_tokenizer=("my-tokenizer.json", tokenizer))  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.num_classes == 300 and job.task_kind == "language_model"
    assert job.spec["dataset"]["tokenizer"] == "my-tokenizer.json"  # the buyer's name
    assert files.get(tokenizer_name(job.id)) == tokenizer  # stored as JSON, re-read as JSON
    agents = [make_agent(kind="platform") for _ in range(2)]
    assert run_until_idle(agents) == 4
    job.refresh_from_db()
    assert job.status == "completed" and job.rounds_done == 2, job.error
    assert int(job_dataset(job).x_train.max()) >= 256  # the server re-tokenised with it


@pytest.mark.django_db(transaction=True)
def test_a_jsonl_job_with_byte_tokens_trains_to_completion(buyer, make_agent) -> None:
    spec = TEXT_SPEC | {"dataset": TEXT_SPEC["dataset"] | {"path": "c.jsonl"}}
    body = "\n".join(json.dumps({"text": line}) for line in LINES).encode()
    response = post(buyer, spec, ("c.jsonl", body))
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.num_classes == 256 and job.dataset_file.endswith("/dataset.jsonl")
    assert run_until_idle([make_agent(kind="platform") for _ in range(2)]) == 4
    job.refresh_from_db()
    assert job.status == "completed", job.error


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("c.txt", b"fine\nalso fine\ncaf\xe9\n", ["c.txt", "line 3", "not valid UTF-8"]),
        ("c.jsonl", b'{"text": "a b"}\n{oops\n', ["c.jsonl", "line 2", "not valid JSON"]),
        ("c.jsonl", b'{"text": "a b"}\n{"body": "x"}\n', ["line 2", '"text" string']),
    ],
)
def test_bad_text_is_refused_naming_the_line(buyer, name: str, body: bytes, words) -> None:
    spec = TEXT_SPEC | {"dataset": TEXT_SPEC["dataset"] | {"path": name}}
    refused(post(buyer, spec, (name, body)), 400, "invalid_dataset", *words)


@pytest.mark.django_db
def test_a_tokenizer_must_be_named_and_uploaded_together(buyer) -> None:
    corpus = ("corpus.txt", "\n".join(LINES).encode())
    spec = TEXT_SPEC | {"dataset": TEXT_SPEC["dataset"] | {"tokenizer": "tok.json"}}
    response = post(buyer, spec, corpus)
    refused(response, 400, "invalid_spec", "dataset.tokenizer", "upload it as 'dataset_tokenizer'")
    response = post(buyer, TEXT_SPEC, corpus, dataset_tokenizer=("tok.json", b"{}"))
    refused(response, 400, "invalid_spec", "dataset.tokenizer", "the spec names none")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "words"),
    [(b"\x80\x81 not json", ["not valid JSON"]), (b"{}", ["not a Hugging Face tokenizer.json"]),
     (b"c" * 20, ["not valid JSON"])],
)  # fmt: skip
def test_a_bad_tokenizer_is_refused(buyer, content: bytes, words: list[str]) -> None:
    pytest.importorskip("tokenizers")
    spec = TEXT_SPEC | {"dataset": TEXT_SPEC["dataset"] | {"tokenizer": "tok.json"}}
    response = post(buyer, spec, ("corpus.txt", "\n".join(LINES).encode()),
                    dataset_tokenizer=("tok.json", content))  # fmt: skip
    refused(response, 400, "invalid_dataset", *words)


@pytest.mark.django_db
def test_length_sharding_is_for_text(buyer) -> None:
    response = post(buyer, SMALL_SPEC | {"sharding": {"method": "length"}}, None)
    assert response.status_code == 400
    assert response.json()["problems"] == [
        {"field": "sharding.method", "reason": "'length' cuts sequence data (dataset kind 'text')"}
    ]
