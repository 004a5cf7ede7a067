"""Experiment tracking: a job's params, per-round metrics and final model, written to MLflow,
TensorBoard event files or a Weights & Biases offline run, through one small interface.

The marketplace logs each round as it closes (marketplace/jobs/tracking.py), and a buyer's
`gpuflex jobs export` logs a finished job after the fact; both hand a `JobRecord` (or its
rounds one by one) to a `Tracker`. Each backend's library is imported only when its tracker
is made, so trainer stays importable without them (the `ml` extra installs them).

Nothing here reaches the network unless an MLflow tracking URI says so: W&B runs offline only.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import shutil
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

JOB_TAG = "gpuflex.job"  # the MLflow tag (and W&B run id) that finds a job's run again
MAX_PARAM = 500  # characters of one param value; MLflow refuses longer ones


class PrivateAddress(ValueError):
    """A tracking URL that reaches the server's own network, not the buyer's."""


def check_public_url(url: str, resolve: Callable[..., list] = socket.getaddrinfo) -> None:
    """Refuse an http(s) URL whose host is, or resolves to, an address off the public
    internet (loopback, private, link-local, cloud metadata): the server would otherwise
    call its own network on a buyer's say-so. A deployment whose MLflow is internal turns
    the check off (the marketplace's GPUFLEX["TRACKING_ALLOW_PRIVATE"])."""
    host = urlsplit(url).hostname or ""
    try:
        infos = resolve(host, None)
    except (OSError, UnicodeError) as exc:
        raise PrivateAddress(f"{host!r} does not resolve: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global:
            raise PrivateAddress(f"{host!r} is {address}, not a public address")


@dataclass(frozen=True)
class RoundRecord:
    step: int  # the round number
    metrics: dict[str, float]


@dataclass
class JobRecord:
    job_id: str
    name: str
    params: dict[str, str]
    rounds: list[RoundRecord] = field(default_factory=list)
    model: Path | None = None  # the final model file, logged as an artifact


def spec_params(spec: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A spec flattened to dotted keys (`optimizer.lr`), values as strings, lists as JSON."""
    out: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= spec_params(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:MAX_PARAM]
    return out


def finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric, finite entries: trackers take floats and choke on NaN or text."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class Tracker(ABC):
    """One run of one job in one tracker. `incremental`: rounds may be logged one at a time,
    by separate processes, as they close; otherwise the whole record is logged at the end."""

    name: str
    incremental = True

    @abstractmethod
    def log_params(self, params: Mapping[str, str]) -> None: ...

    @abstractmethod
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    @abstractmethod
    def log_artifact(self, path: Path) -> None: ...

    def close(self, finished: bool = False) -> None:
        """Flush; `finished` also marks the run as ended where the tracker has the notion."""
        return None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def log_job(tracker: Tracker, record: JobRecord) -> None:
    """A whole job: params, every round's metrics, the final model; marks the run finished."""
    tracker.log_params(record.params)
    for rnd in record.rounds:
        tracker.log_metrics(rnd.step, rnd.metrics)
    if record.model is not None:
        tracker.log_artifact(record.model)
    tracker.close(finished=True)


class MLflowTracker(Tracker):
    """An MLflow run per job, found again by its `gpuflex.job` tag, so that rounds logged by
    different worker processes land in the same run."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str, job_id: str, run_name: str) -> None:
        from mlflow.tracking import MlflowClient

        if tracking_uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance and refuses it unless told; it is
            # what the issue asks for (a local store that needs no server or database)
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        runs = self.client.search_runs(
            [exp_id], filter_string=f"tags.`{JOB_TAG}` = '{job_id}'", max_results=1
        )
        if runs:
            self.run_id = runs[0].info.run_id
            self._params = dict(runs[0].data.params)
        else:
            run = self.client.create_run(exp_id, run_name=run_name, tags={JOB_TAG: job_id})
            self.run_id, self._params = run.info.run_id, {}

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        # a param is written once: MLflow refuses to change one, and a re-run logs the same
        new = [Param(k, v) for k, v in params.items() if k not in self._params]
        for start in range(0, len(new), 100):  # MLflow's batch limit for params
            self.client.log_batch(self.run_id, params=new[start : start + 100])
        self._params |= {p.key: p.value for p in new}

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in finite(metrics).items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, finished: bool = False) -> None:
        if finished:
            self.client.set_terminated(self.run_id)


class TensorBoardTracker(Tracker):
    """Event files in `log_dir`: a scalar per metric per round, the params as a text summary,
    the model copied beside them (TensorBoard has no artifacts of its own)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log_params(self, params: Mapping[str, str]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(params.items()))
        self.writer.add_text("params", f"| param | value |\n|---|---|\n{rows}", global_step=0)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in finite(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)

    def log_artifact(self, path: Path) -> None:
        target = self.log_dir / "artifacts"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / Path(path).name)

    def close(self, finished: bool = False) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run in offline mode under `directory` (`wandb sync` uploads it
    later, from wherever the buyer likes). Offline runs cannot be reopened by another
    process, so the marketplace logs a job's whole record to it once the job ends."""

    name = "wandb"
    incremental = False

    def __init__(self, directory: Path, project: str, job_id: str, run_name: str) -> None:
        import wandb

        Path(directory).mkdir(parents=True, exist_ok=True)
        os.environ["WANDB_MODE"] = "offline"  # belt and braces: the service reads it too
        self.run = wandb.init(
            mode="offline",
            dir=str(directory),
            project=project,
            name=run_name,
            id=_wandb_id(job_id),
            settings=wandb.Settings(
                silent=True, console="off", disable_git=True, x_disable_stats=True,
                x_disable_meta=True,
            ),
        )  # fmt: skip

    def log_params(self, params: Mapping[str, str]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(finite(metrics), step=step)

    def log_artifact(self, path: Path) -> None:
        import wandb

        artifact = wandb.Artifact(f"model-{self.run.id}", type="model")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def close(self, finished: bool = False) -> None:
        self.run.finish()


def _wandb_id(job_id: str) -> str:
    # W&B run ids allow letters, digits, - and _ only
    return "".join(c for c in job_id if c.isalnum() or c in "-_")[:64] or "job"
