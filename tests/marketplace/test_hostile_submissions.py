"""#38 findings 6 and 7: what a buyer submits is parsed, tokenized and built by the worker that
prepares the job, in a child process (jobs/isolation.py), never in the web request; a hostile
tokenizer or config fails its job with the reason, and the worker goes on to the next job."""

from __future__ import annotations

import json

import pytest

from marketplace.jobs import checks
from marketplace.jobs.models import Job
from marketplace.rounds.models import Round
from tests.marketplace.test_dataset_formats import LINES, TEXT_SPEC, post
from tests.trainer.test_text_formats import bpe_tokenizer_json

pytestmark = pytest.mark.usefixtures("own_media")

TOKENIZED = TEXT_SPEC | {"dataset": TEXT_SPEC["dataset"] | {"tokenizer": "tok.json"}}
CORPUS = ("corpus.txt", "\n".join([*LINES, "a" * 60 + "!"]).encode())


def backtracking_tokenizer() -> bytes:
    """A working BPE tokenizer with a Replace normalizer whose regex backtracks
    catastrophically: `tokenizers` panics on the corpus's line of a's (onig's
    retry-limit-in-match), a pyo3 PanicException that `except Exception` does not catch."""
    data = json.loads(bpe_tokenizer_json(LINES))
    data["normalizer"] = {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "b"}
    return json.dumps(data).encode()


@pytest.fixture
def tokenizer_files() -> tuple[bytes, bytes]:
    """(hostile, sound) tokenizer.json, made before no_tokenizers_here takes the library away."""
    pytest.importorskip("tokenizers")
    return backtracking_tokenizer(), bpe_tokenizer_json(LINES).encode()


@pytest.fixture
def no_tokenizers_here(monkeypatch, tokenizer_files) -> list[str]:
    """`tokenizers` unusable in this process (the web server's and the preparing worker's):
    only the child processes, fresh interpreters, may build a tokenizer."""
    import tokenizers

    calls: list[str] = []

    class Refused:
        @staticmethod
        def from_str(text: str) -> None:
            calls.append(text[:20])
            raise AssertionError("a tokenizer was built in this process")

    monkeypatch.setattr(tokenizers, "Tokenizer", Refused)
    return calls


def test_a_panicking_tokenizer_fails_its_job_in_a_child_and_the_worker_goes_on(
    buyer, django_capture_on_commit_callbacks, tokenizer_files, no_tokenizers_here
) -> None:
    """#38 finding 6: the tokenizer's panic killed the web worker that held the request."""
    hostile, sound = tokenizer_files
    with django_capture_on_commit_callbacks() as sent:
        response = post(buyer, TOKENIZED, CORPUS, dataset_tokenizer=("tok.json", hostile))
    assert response.status_code == 201, response.content  # bounded checks only
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == "running" and job.footprint == {} and not job.shards.exists()
    assert no_tokenizers_here == []  # the request built no tokenizer

    for send in sent:  # the preparation, in this (the worker's) process
        send()
    job.refresh_from_db()
    assert job.status == "failed", job.error
    assert "retry-limit-in-match" in job.error and "tok" in job.error, job.error
    assert not Round.objects.filter(job=job).exists() and not job.shards.exists()
    shown = buyer.get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["status"] == "failed" and shown["error"] == job.error

    # the same worker prepares the next job, with a sound tokenizer, in a child too
    with django_capture_on_commit_callbacks(execute=True):
        good = post(buyer, TOKENIZED, CORPUS, dataset_tokenizer=("tok.json", sound))
    assert good.status_code == 201, good.content
    job = Job.objects.get(pk=good.json()["id"])
    assert job.status == "running", job.error
    assert job.num_classes == 300 and job.footprint["parameters"] > 0 and job.shards.count() == 2
    assert Round.objects.get(job=job).number == 1
    assert no_tokenizers_here == []


HUGE = [
    # gpt2 with n_embd 65536 and 1,000 layers: 35 s in the request, then a 400
    ({"model_type": "gpt2", "n_embd": 65536, "n_layer": 1000, "vocab_size": 50257,
      "n_positions": 64}, "config.n_embd"),
    # llama with hidden_size 2^20 and 10,000 layers: 270 s and 1.8 GB in the request
    ({"model_type": "llama", "hidden_size": 2**20, "num_hidden_layers": 10000,
      "num_attention_heads": 16, "vocab_size": 32000}, "config.hidden_size"),
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 10000,
      "num_attention_heads": 4, "vocab_size": 300}, "config.num_hidden_layers"),
    # every size plausible, together far past the cap: refused by their product
    ({"model_type": "gpt2", "n_embd": 8192, "n_layer": 200, "vocab_size": 50257,
      "n_positions": 64}, "at least 13,833,478,144 parameters"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "named"), HUGE)
def test_a_huge_hf_config_is_refused_by_its_numbers_alone(
    buyer, monkeypatch, config: dict, named: str
) -> None:
    """#38 finding 7: huge configs were built (on the meta device, for minutes) in the request."""
    import trainer.hf_models

    def refused(*args, **kwargs):
        raise AssertionError("a model was built in the request")

    monkeypatch.setattr(checks, "measure_footprint", refused)
    monkeypatch.setattr(trainer.hf_models, "build_hf_model", refused)
    spec = TEXT_SPEC | {"model": {"arch": "hf_causal_lm", "config": config}}
    response = post(buyer, spec, CORPUS)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid_spec" and named in body["detail"], body["detail"]
    assert not Job.objects.exists()


def test_an_hf_model_is_measured_and_built_by_the_worker_not_the_request(
    buyer, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    """A config within bounds: the request measures nothing; the worker measures it on the
    meta device and builds it, each in a child, then opens round 1."""
    import trainer.hf_models

    def refused(*args, **kwargs):
        raise AssertionError("a model was built in this process")

    monkeypatch.setattr(checks, "measure_footprint", refused)
    monkeypatch.setattr(trainer.hf_models, "build_hf_model", refused)
    config = {"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2, "vocab_size": 256,
              "n_positions": 32}  # fmt: skip
    spec = TEXT_SPEC | {"model": {"arch": "hf_causal_lm", "config": config}}
    with django_capture_on_commit_callbacks() as sent:
        response = post(buyer, spec, CORPUS)
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.footprint == {} and not Round.objects.exists()
    for send in sent:
        send()
    job.refresh_from_db()
    assert job.status == "running", job.error
    assert job.footprint["parameters"] > 0 and job.num_classes == 256
    rnd = Round.objects.get(job=job)
    assert rnd.number == 1 and rnd.tasks.count() == 2


def test_a_model_past_the_cap_on_the_meta_device_fails_in_the_worker(
    buyer, django_capture_on_commit_callbacks
) -> None:
    """Past the arithmetic, the exact count on the meta device still holds the tier's cap:
    learned positions the lower bound leaves out, measured by the worker."""
    config = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 1, "n_head": 2, "vocab_size": 256,
              "n_positions": 2**20}  # fmt: skip
    spec = TEXT_SPEC | {"model": {"arch": "hf_causal_lm", "config": config}}
    with django_capture_on_commit_callbacks(execute=True):
        response = post(buyer, spec, CORPUS)
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == "failed" and "allows at most" in job.error, job.error
    assert not Round.objects.filter(job=job).exists()
