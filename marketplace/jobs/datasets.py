"""The held-out split of a job's dataset, for evaluation on the server."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from marketplace.jobs import files, isolation
from marketplace.jobs.dataset_files import archive_limits, tokenizer_name
from marketplace.jobs.models import Job
from trainer.spec import JobSpec

if TYPE_CHECKING:
    from trainer.datasets import Dataset

# the last few jobs' datasets, by (job, file): a worker aggregating a job's rounds loads its
# dataset once; jobs and their files never change
_loaded: OrderedDict[tuple[str, str], Dataset] = OrderedDict()
_KEEP = 4


def job_dataset(job: Job) -> Dataset:
    """Same (seed, test_fraction) as at submission, hence the same held-out split."""
    key = (str(job.id), job.dataset_file)
    if key not in _loaded:
        _loaded[key] = _load(job.id, job.dataset_file, job.parsed_spec)
        while len(_loaded) > _KEEP:
            _loaded.popitem(last=False)
    _loaded.move_to_end(key)
    return _loaded[key]


def _load(job_id: object, dataset_file: str, spec: JobSpec) -> Dataset:
    from trainer.datasets import load_dataset

    if not dataset_file:
        return load_dataset(spec.dataset, seed=spec.seed)
    with contextlib.ExitStack() as stack:
        path = stack.enter_context(files.local_copy(dataset_file, Path(dataset_file).suffix))
        if spec.dataset.tokenizer:  # a text job's tokenizer.json, stored beside its dataset
            tokenizer = str(stack.enter_context(files.local_copy(tokenizer_name(job_id))))
            local = spec.dataset.model_copy(update={"path": str(path), "tokenizer": tokenizer})
            # its regexes run in Rust: in a child, as when the job was prepared
            return isolation.load_dataset(local, spec.seed, shown=spec.dataset.path or "")
        local = spec.dataset.model_copy(update={"path": str(path)})
        return load_dataset(local, seed=spec.seed, archive_limits=archive_limits())
