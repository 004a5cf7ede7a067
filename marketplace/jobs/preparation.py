"""Building a submitted job's model and opening its first round, in a worker.

The model is the seed's, or the buyer's checkpoint loaded into it (jobs/model_files.py); a
LoRA job's adapters always come from the seed.

The request that submits a job validates everything (the model's size is measured on the meta
device, nothing allocated) and stores the job, its dataset and its shards; the model's weights
are built here, in a Celery task on the aggregation queue, never in a web process: a spec
that asks for hundreds of millions of parameters costs a worker the memory, not the server
everyone's requests go through. Idempotent: a job whose round 1 exists is left alone, so a
redelivered message, or the tick's re-enqueue of a lost one, does nothing twice.

A job with a tokenizer.json or a Hugging Face config was accepted on bounded checks only: its
dataset is read and its model measured here first (jobs/worker_checks.py), and an hf_* model
is built in a child process too (jobs/isolation.py), so that a panic in `tokenizers` or a
runaway config kills that child and fails the job with the reason, never this worker.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from django.db import transaction

from marketplace.jobs import files, isolation
from marketplace.jobs.errors import MarketplaceError
from marketplace.jobs.model_files import checkpoint_name, program_name
from marketplace.jobs.models import Job
from marketplace.jobs.preparation_queue import enqueue_preparation as enqueue_preparation
from marketplace.jobs.services import fail_job
from marketplace.rounds.lifecycle import open_round
from marketplace.rounds.models import Round
from marketplace.sweeps.queue import enqueue_sweep
from trainer.models import build_model, read_weights
from trainer.spec import HF_ARCHS

log = logging.getLogger(__name__)


def prepare_job(job_id: object) -> Round | None:
    """Build the seed's model and open round 1; None when there is nothing to do. A sweep
    has no model of its own: it starts its first trials (marketplace/sweeps), and the
    tick's re-sending of a lost preparation re-sends a lost sweep step the same way."""
    job = Job.objects.filter(pk=job_id).only("spec", "status").first()
    if job is not None and job.kind == "sweep":
        if job.is_active:
            with transaction.atomic():
                enqueue_sweep(job.pk)
        return None
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).filter(pk=job_id).first()
        if job is None or not job.is_active or Round.objects.filter(job=job).exists():
            return None
        try:
            state = _first_model(job)
        except MarketplaceError as exc:  # the job's files cannot make its model: say why
            log.warning("job %s failed in preparation: %s", job.pk, exc.detail)
            fail_job(job, exc.detail)
            return None
        return open_round(job, 1, state)


def _first_model(job: Job) -> dict:
    """Round 1's model state: the job checked first if its request left that to the worker."""
    from marketplace.jobs.worker_checks import awaits_checks, check_in_worker

    if awaits_checks(job):
        job = check_in_worker(job)
    spec = job.parsed_spec
    # the buyer's checkpoint (checked against the model at submission), or a scoring
    # job's source job's final model (stored under the same name), else the seed's
    stored = spec.model.checkpoint or spec.source
    shape = tuple(job.input_shape)
    if spec.model.arch in HF_ARCHS:  # transformers builds the buyer's config: in a child
        with tempfile.TemporaryDirectory(prefix="gpuflex-prepare-") as tmp:
            path = Path(tmp) / "weights.safetensors"
            if stored:
                path.write_bytes(files.get(checkpoint_name(job.pk)))
            model_bytes = int(job.footprint.get("state_bytes", 0))
            return isolation.build(spec.model, shape, job.num_classes, spec.seed,
                                   path if stored else None, model_bytes)  # fmt: skip
    if spec.model.arch == "exported":  # the buyer's program, with its own weights
        with files.local_copy(program_name(job.pk), ".pt2") as program:
            here = spec.model.model_copy(update={"program": str(program)})
            model = build_model(here, shape, job.num_classes, seed=spec.seed)
            return {k: v.detach().clone() for k, v in model.state_dict().items()}
    weights = read_weights(files.get(checkpoint_name(job.pk))) if stored else None
    model = build_model(spec.model, shape, job.num_classes, seed=spec.seed, weights=weights)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
