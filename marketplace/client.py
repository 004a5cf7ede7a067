"""The GPUFlex marketplace SDK: the public REST API over httpx, and nothing of Django.

client = Client("https://gpuflex.example", api_key="gfx_u_…")
job = client.submit("job.yaml", budget="5.00", max_price_per_gpu_hour="0.50")
for state in client.follow(job["id"]):
    print(state["rounds_done"], state["last_metrics"])
client.download(job["id"], "out/")
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"
MODEL_SUFFIX = {"safetensors": ".safetensors", "onnx": ".onnx", "torchscript": ".torchscript.pt"}
TERMINAL = frozenset({"completed", "failed", "cancelled", "stopped"})


class GPUFlexError(Exception):
    """A 4xx/5xx answer: `code` and `detail` come from the server's error body."""

    def __init__(self, status: int, code: str, detail: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.body = status, code, detail, body


class Client:
    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        server = (server or os.environ.get("GPUFLEX_SERVER") or DEFAULT_SERVER).rstrip("/")
        key = api_key or os.environ.get("GPUFLEX_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            base_url=f"{server}/api/v1/", headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
                code, detail = body.get("error", "error"), body.get("detail", response.text)
            except ValueError:
                body, code, detail = None, "error", response.text[:500]
            raise GPUFlexError(response.status_code, code, detail, body)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _pages(self, path: str, page_size: int = 100) -> Iterator[dict[str, Any]]:
        offset = 0
        while True:
            page = self._json("GET", path, params={"limit": page_size, "offset": offset})
            yield from page["results"]
            offset += len(page["results"])
            if not page.get("next") or not page["results"]:
                return

    # -- buyers ----------------------------------------------------------------------------

    def submit(
        self,
        spec: str | Path | dict[str, Any],
        *,
        dataset: str | Path | None = None,
        budget: str,
        tier: str = "hybrid",
        max_price_per_gpu_hour: str = "1.00",
        federated: str = "",
        checkpoint: str | Path | None = None,
        model_config: str | Path | None = None,
    ) -> dict[str, Any]:
        """Submit a job, holding `budget` credits of your balance in escrow; `spec` is a
        mapping or a YAML/JSON file (sent as text, parsed by the server, so errors come back
        with the spec's field paths). `federated`: the name of the local dataset its nodes
        train on, which never leaves them (docs/federated.md); the spec's own dataset is then
        only evaluated on. `checkpoint`: the safetensors file `model.checkpoint` names (a
        training job's initial weights, or the model an evaluate / inference job scores);
        `model_config`: an hf_* model's config.json (docs/job-spec.md)."""
        text = json.dumps(spec) if isinstance(spec, dict) else Path(spec).read_text("utf-8")
        form = {
            "spec": text,
            "tier": tier,
            "budget": str(budget),
            "max_price_per_gpu_hour": str(max_price_per_gpu_hour),
        }
        if federated:
            form["federated_dataset"] = federated
        named = {"dataset": dataset, "model_checkpoint": checkpoint, "model_config": model_config}
        with contextlib.ExitStack() as stack:
            uploads = {
                field: (Path(p).name, stack.enter_context(Path(p).open("rb")))
                for field, p in named.items()
                if p is not None
            }
            extra = {"files": uploads} if uploads else {}
            return self._json("POST", "jobs/", data=form, **extra)

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._pages("jobs/"))

    def job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"jobs/{job_id}/")

    def rounds(self, job_id: str) -> list[dict[str, Any]]:
        return list(self._pages(f"jobs/{job_id}/rounds/"))

    def pause(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"jobs/{job_id}/pause")

    def resume(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"jobs/{job_id}/resume")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"jobs/{job_id}/cancel")

    def follow(self, job_id: str, interval: float = 2.0) -> Iterator[dict[str, Any]]:
        """The job's state every `interval` seconds until it completes, fails or is cancelled."""
        while True:
            state = self.job(job_id)
            yield state
            if state["status"] in TERMINAL:
                return
            time.sleep(interval)

    def model_bytes(self, job_id: str, fmt: str = "safetensors") -> bytes:
        """The latest model: safetensors, onnx, torchscript or hf (a zip of the HF folder)."""
        return self._request("GET", f"jobs/{job_id}/model", params={"format": fmt}).content

    def predictions(self, job_id: str, path: str | Path | None = None) -> Path:
        """A finished inference job's predictions, one Parquet row per dataset row in its
        order (row, prediction, prob_<k>), written to `path` (default JOB.predictions.parquet)."""
        out = Path(path or f"{job_id}.predictions.parquet")
        out.write_bytes(self._request("GET", f"jobs/{job_id}/predictions").content)
        return out

    def provenance(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"jobs/{job_id}/provenance")

    def tracking(self, job_id: str) -> dict[str, Any]:
        """Params and per-round metrics, as the experiment trackers log them."""
        return self._json("GET", f"jobs/{job_id}/tracking")

    def download(
        self, job_id: str, directory: str | Path = ".", fmt: str = "safetensors"
    ) -> tuple[Path, Path]:
        """Write the model (JOB.safetensors, JOB.onnx, JOB.torchscript.pt, or the folder
        JOB-hf/ for hf) and JOB.provenance.json into `directory`."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        data = self.model_bytes(job_id, fmt)
        if fmt == "hf":
            model = out / f"{job_id}-hf"
            _unzip_flat(data, model)
        else:
            model = out / f"{job_id}{MODEL_SUFFIX.get(fmt, '.' + fmt)}"
            model.write_bytes(data)
        record = out / f"{job_id}.provenance.json"
        record.write_text(json.dumps(self.provenance(job_id), indent=1), "utf-8")
        return model, record

    def export(self, job_id: str, to: str, target: str | None = None) -> str:
        """Log a job after the fact: its spec as params, every round's metrics and the final
        model to MLflow (`target`: a tracking URI, default file:./mlruns), TensorBoard
        (`target`: a log folder, default runs/JOB) or W&B offline (`target`: a folder, default
        ., the run under ./wandb). Returns where it went."""
        from trainer.tracking import (
            JobRecord,
            MLflowTracker,
            RoundRecord,
            TensorBoardTracker,
            WandbTracker,
            log_job,
        )

        info = self.tracking(job_id)
        rounds = [RoundRecord(int(r["step"]), r["metrics"]) for r in info["rounds"]]
        with tempfile.TemporaryDirectory(prefix="gpuflex-export-") as tmp:
            model = Path(tmp) / f"{job_id}.safetensors"
            model.write_bytes(self.model_bytes(job_id))
            record = JobRecord(info["job"], info["name"], info["params"], rounds, model)
            experiment = info["params"].get("tracking.experiment") or "gpuflex"
            experiment = "gpuflex" if experiment in ("null", "") else experiment
            if to == "mlflow":
                target = target or f"file:{Path('mlruns').resolve()}"
                tracker = MLflowTracker(target, experiment, record.job_id, record.name)
            elif to == "tensorboard":
                target = target or str(Path("runs") / job_id)
                tracker = TensorBoardTracker(Path(target))
            elif to == "wandb":
                target = target or "."
                os.environ.setdefault("WANDB_MODE", "offline")
                tracker = WandbTracker(Path(target), experiment, record.job_id, record.name)
            else:
                raise ValueError(f"unknown tracker {to!r}; one of mlflow, tensorboard, wandb")
            log_job(tracker, record)
        return target

    def capacity(self) -> dict[str, Any]:
        return self._json("GET", "market/capacity")


def _unzip_flat(data: bytes, folder: Path) -> None:
    """The HF folder's files, by their base names only: a zip cannot write outside `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            name = Path(info.filename).name
            if info.is_dir() or not name:
                continue
            (folder / name).write_bytes(zf.read(info))
