"""The held-out split of a job's dataset, for evaluation on the server."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from marketplace.jobs import files
from marketplace.jobs.models import Job
from trainer.datasets import Dataset, load_dataset
from trainer.spec import parse_spec


@lru_cache(maxsize=4)
def _load(job_id: str, dataset_file: str, spec_json: str) -> Dataset:
    import json

    spec = parse_spec(json.loads(spec_json))
    if not dataset_file:
        return load_dataset(spec.dataset, seed=spec.seed)
    with files.local_copy(dataset_file, Path(dataset_file).suffix) as path:
        local = spec.dataset.model_copy(update={"path": str(path)})
        return load_dataset(local, seed=spec.seed)


def job_dataset(job: Job) -> Dataset:
    """Same (seed, test_fraction) as at submission, hence the same held-out split."""
    import json

    return _load(str(job.id), job.dataset_file, json.dumps(job.spec, sort_keys=True))
