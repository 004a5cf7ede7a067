"""The GPUFlex marketplace SDK: the public REST API over httpx, and nothing of Django.

client = Client("https://gpuflex.example", api_key="gfx_u_…")
job = client.submit("job.yaml", budget="5.00", max_price_per_gpu_hour="0.50")
for state in client.follow(job["id"]):  # pushed by the server as the job changes
    print(state["rounds_done"], state["last_metrics"])
client.download(job["id"], "out/")
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"
MODEL_SUFFIX = {"safetensors": ".safetensors", "onnx": ".onnx", "torchscript": ".torchscript.pt"}
TERMINAL = frozenset({"completed", "failed", "cancelled", "stopped"})
# datasets larger than this go as a chunked, resumable upload (docs/uploads.md), not inline
CHUNKED_ABOVE = 16 * 2**20
CHUNK_BYTES = 8 * 2**20
# the longest a model download waits for the server's worker to make an onnx / torchscript /
# hf export (202 answers), and the bounds on the pause between its requests
EXPORT_WAIT_S = 600.0
RETRY_AFTER_BOUNDS_S = (0.5, 60.0)
RETRY_WAIT_S = 1.0  # times the failures in a row: the wait before asking where to resume
# (bytes the server has, total bytes): called as an upload moves on
Progress = Callable[[int, int], None]


class GPUFlexError(Exception):
    """A 4xx/5xx answer (or an export still not ready, ExportNotReady): `code` and `detail`
    come from the server's error body."""

    def __init__(self, status: int, code: str, detail: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.body = status, code, detail, body


class ExportNotReady(GPUFlexError):
    """The server's worker had not finished a model's export when the client stopped
    waiting (Client.model_bytes's `wait`): the export goes on; asking later downloads it."""

    def __init__(self, body: dict[str, Any], waited: float) -> None:
        fmt = body.get("format", "the")
        super().__init__(
            202, "export_not_ready",
            f"the {fmt} export was still being made after {waited:.0f} s; it goes on on the "
            "server, so download again later",
            body,
        )  # fmt: skip


class Client:
    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        server = server_url(server)
        self.server = server
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
        _raise_for(response)
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
        max_price_per_gpu_hour: str | None = None,
        federated: str = "",
        progress: Progress | None = None,
        chunked_above: int | None = None,
        uploads: dict[str, str | Path] | None = None,
        checkpoint: str | Path | None = None,
        model_config: str | Path | None = None,
    ) -> dict[str, Any]:
        """Submit a job, holding `budget` credits of your balance in escrow; `spec` is a
        mapping or a YAML/JSON file (sent as text, parsed by the server, so errors come back
        with the spec's field paths). `federated`: the name of the local dataset its nodes
        train on, which never leaves them (docs/federated.md); the spec's own dataset is then
        only evaluated on. A spec file's own files (its dataset, tokenizer, model config and
        checkpoint, named relative to it) are uploaded with it when they exist; `dataset`,
        `checkpoint` (the safetensors file `model.checkpoint` names: a training job's initial
        weights, or the model an evaluate / inference job scores), `model_config` (an hf_*
        model's config.json) and `uploads` ({form field: path}) name others. A dataset larger
        than `chunked_above` bytes (CHUNKED_ABOVE), or one the server finds too large to take
        inline, goes as a chunked upload first (`upload`, reporting to `progress`).
        `max_price_per_gpu_hour` None: the server sets the market's price, the median asking
        price of the online nodes that fit the job (the job's `max_price_per_gpu_hour`)."""
        text = json.dumps(spec) if isinstance(spec, dict) else Path(spec).read_text("utf-8")
        form = {
            "spec": text,
            "tier": tier,
            "budget": str(budget),
        }
        if max_price_per_gpu_hour is not None:  # else the market's price (the server's)
            form["max_price_per_gpu_hour"] = str(max_price_per_gpu_hour)
        if federated:
            form["federated_dataset"] = federated
        named = {} if isinstance(spec, dict) else spec_files(Path(spec), federated=bool(federated))
        named |= {k: Path(v) for k, v in (uploads or {}).items()}
        if dataset is not None:
            named["dataset"] = Path(dataset)
        if checkpoint is not None:
            named["model_checkpoint"] = Path(checkpoint)
        if model_config is not None:
            named["model_config"] = Path(model_config)
        if not named:
            return self._json("POST", "jobs/", data=form)
        data = named.get("dataset")
        limit = CHUNKED_ABOVE if chunked_above is None else chunked_above
        if data is not None and data.stat().st_size > limit:
            upload = self.upload(data, progress=progress)
            return self._post_job(form | {"dataset_upload": upload["id"]}, named, "dataset")
        try:
            return self._post_job(form, named)
        except GPUFlexError as exc:
            if data is None or exc.status != 413 or exc.code != "too_large":
                raise  # else: over the server's inline limit, so chunked after all
        upload = self.upload(data, progress=progress)
        return self._post_job(form | {"dataset_upload": upload["id"]}, named, "dataset")

    def _post_job(
        self, form: dict[str, str], named: dict[str, Path], *leave_out: str
    ) -> dict[str, Any]:
        with contextlib.ExitStack() as stack:
            sent = {field: (path.name, stack.enter_context(path.open("rb")))
                    for field, path in named.items() if field not in leave_out}  # fmt: skip
            return self._json("POST", "jobs/", data=form, files=sent or None)

    # -- chunked uploads (docs/uploads.md) -------------------------------------------------

    def upload(
        self,
        path: str | Path,
        *,
        chunk_bytes: int | None = None,
        progress: Progress | None = None,
        retries: int = 5,
    ) -> dict[str, Any]:
        """Upload a file in chunks and finish it; returns the finished upload (its `id`
        goes in a job's `dataset_upload`). Resumable: an open upload of the same file (same
        sha256 and size) left by an interrupted run goes on from where the server has it,
        and a finished one not used yet is returned as it is. A dropped connection is
        retried up to `retries` times in a row, from the offset the server reports.
        Memory holds one chunk at a time."""
        path = Path(path)
        chunk_bytes = chunk_bytes or CHUNK_BYTES
        size = path.stat().st_size
        digest = file_sha256(path)
        upload = self._resumable(size, digest) or self._json(
            "POST", "uploads/", json={"filename": path.name, "size": size, "sha256": digest}
        )
        if upload["status"] == "complete":
            if progress:
                progress(size, size)
            return upload
        failures = 0
        with path.open("rb") as fh:
            while True:
                at = int(upload["received"])
                if progress:
                    progress(at, size)
                if at >= size:
                    break
                fh.seek(at)
                data = fh.read(min(chunk_bytes, size - at))
                headers = {
                    "Content-Range": f"bytes {at}-{at + len(data) - 1}/{size}",
                    "Content-Type": "application/octet-stream",
                }
                try:
                    upload = self._json("PUT", f"uploads/{upload['id']}/", content=data,
                                        headers=headers)  # fmt: skip
                    failures = 0
                except (httpx.TransportError, GPUFlexError) as exc:
                    server_side = isinstance(exc, GPUFlexError) and exc.status < 500
                    if server_side and exc.code not in ("chunk_out_of_order", "bad_chunk"):
                        raise
                    failures += 1
                    if failures > retries:
                        raise
                    time.sleep(RETRY_WAIT_S * failures)
                    upload = self.upload_status(upload["id"])  # where the server stands
        return self._json("POST", f"uploads/{upload['id']}/finish")

    def upload_status(self, upload_id: str) -> dict[str, Any]:
        return self._json("GET", f"uploads/{upload_id}/")

    def uploads(self) -> list[dict[str, Any]]:
        return list(self._pages("uploads/"))

    def delete_upload(self, upload_id: str) -> None:
        self._request("DELETE", f"uploads/{upload_id}/")

    def _resumable(self, size: int, digest: str) -> dict[str, Any] | None:
        """This file's unfinished (or finished, unused) upload, if one is left."""
        for status in ("complete", "open"):
            found = self._json("GET", "uploads/", params={"sha256": digest, "status": status})
            for upload in found["results"]:
                if int(upload["size"]) == size:
                    return upload
        return None

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._pages("jobs/"))

    def resolve_job(self, ref: str) -> str:
        """A job's full id from its id or a unique start of it (the 8 characters the web
        shows). GPUFlexError 404 `not_found` when none of your jobs' ids starts so, 400
        `ambiguous_id` (naming them) when several do."""
        ref = ref.strip().lower()
        with contextlib.suppress(ValueError):
            return str(uuid.UUID(ref))
        found = self._json("GET", "jobs/", params={"id_prefix": ref, "limit": 5})
        ids = [job["id"] for job in found["results"]]
        if not ids:
            raise GPUFlexError(404, "not_found", f"none of your jobs has an id starting with "
                               f"{ref!r} (`gpuflex jobs` lists them)")  # fmt: skip
        if len(ids) > 1:
            shown = ", ".join(i[: len(ref) + 4] + "…" for i in ids)
            more = " and more" if found.get("count", len(ids)) > len(ids) else ""
            raise GPUFlexError(400, "ambiguous_id", f"{ref!r} starts the ids of several of your "
                               f"jobs ({shown}{more}); give more of the id")  # fmt: skip
        return ids[0]

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

    def events(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job's state now, then each time it changes, pushed by the server (Server-Sent
        Events) until the job ends or the server closes the stream (after a few minutes).
        GPUFlexError 503 when the server holds all the streams it may."""
        headers = {"Accept": "text/event-stream"}
        with self._http.stream("GET", f"jobs/{job_id}/events", headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            for event, data in sse_messages(response.iter_lines()):
                if event == "state":
                    yield json.loads(data)

    def follow(self, job_id: str, interval: float = 2.0) -> Iterator[dict[str, Any]]:
        """The job's state now and at each change until it completes, fails, stops or is
        cancelled. Pushed by the server; where it holds no more streams (503) or the stream
        breaks, polled once, then after `interval` seconds the stream is tried again."""
        last: dict[str, Any] | None = None
        while True:
            try:
                for state in self.events(job_id):
                    if state != last:
                        last = state
                        yield state
                    if state["status"] in TERMINAL:
                        return
                continue  # the server ended the stream (its lifetime): open another
            except GPUFlexError as exc:
                if exc.status != 503:
                    raise
            except (httpx.TransportError, ValueError):
                pass  # a dropped or garbled stream: poll, then stream again
            state = self.job(job_id)
            if state != last:
                last = state
                yield state
            if state["status"] in TERMINAL:
                return
            time.sleep(interval)

    def fit(
        self,
        module: Any,
        loss: Callable[[Any, Any], Any],
        example_inputs: tuple[Any, Any],
        dataset: Any,
        *,
        budget: str,
        **options: Any,
    ) -> Any:
        """Train a PyTorch `module` with `loss` on `dataset` ((inputs, targets) as tensors or
        arrays, a Parquet file, an image folder, or "digits"): exported with its loss as a
        torch.export program on `example_inputs` (a small batch), uploaded, submitted,
        followed with a progress bar; returns a marketplace.notebook.FitResult whose `model`
        is `module` trained. `options`: name, tier, spec (sections over the defaults),
        logits, progress, interval. Needs torch (marketplace/notebook.py)."""
        from marketplace.notebook import fit

        return fit(self, module, loss, example_inputs, dataset, budget=budget, **options)

    def model_bytes(
        self, job_id: str, fmt: str = "safetensors", *, wait: float = EXPORT_WAIT_S
    ) -> bytes:
        """The latest model: safetensors, onnx, torchscript, hf (a zip of the HF folder) or
        pt2 (an exported model's program, trained). The server's worker makes an onnx,
        torchscript or hf export on first request, answering 202 meanwhile: this asks again
        as its Retry-After says, for up to `wait` seconds (then ExportNotReady)."""
        deadline = time.monotonic() + wait
        while True:
            response = self._request("GET", f"jobs/{job_id}/model", params={"format": fmt})
            if response.status_code != 202:
                return response.content
            pause = _retry_after(response)
            if time.monotonic() + pause > deadline:
                raise ExportNotReady(response.json(), wait)
            time.sleep(pause)

    def predictions(self, job_id: str, path: str | Path | None = None) -> Path:
        """A finished inference job's predictions, one Parquet row per dataset row in its
        order (row, prediction, prob_<k>), written to `path` (default JOB.predictions.parquet)."""
        out = Path(path or f"{job_id}.predictions.parquet")
        out.write_bytes(self._request("GET", f"jobs/{job_id}/predictions").content)
        return out

    def provenance(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"jobs/{job_id}/provenance")

    def anchors(self, job_id: str) -> dict[str, Any]:
        """Where the job's provenance is anchored on chain (registry, job key, transactions)."""
        return self._json("GET", f"jobs/{job_id}/anchors")

    def verify(self, job_id: str, chain_url: str, directory: str | Path = ".") -> Any:
        """Download the model and provenance record and check them against the chain at
        `chain_url` (a JSON-RPC URL of your choosing): model hash, provenance chain, anchor
        transaction. Returns a marketplace.verify.Verification (`.ok`, `.problems`)."""
        from marketplace.verify import verify_download

        model, record = self.download(job_id, directory)
        return verify_download(model, record, self.anchors(job_id), chain_url)

    # -- providers -------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        """The provider's nodes, each with its state and last heartbeat (`GET nodes/`)."""
        return list(self._pages("nodes/"))

    def withdrawals(self) -> dict[str, Any]:
        """Your withdrawals of unspent on-chain deposits, and how much you can withdraw."""
        return self._json("GET", "ledger/withdrawals")

    def withdraw(self, amount: str, idempotency_key: str) -> dict[str, Any]:
        """Withdraw unspent on-chain deposits to your registered wallet; pull it from the
        escrow with `payout_proof(id)` once its batch is posted."""
        body = {"amount": str(amount), "idempotency_key": idempotency_key}
        return self._json("POST", "ledger/withdrawals", json=body)

    def withdraw_fees(
        self, amount: str, wallet_address: str, idempotency_key: str
    ) -> dict[str, Any]:
        """Operators: withdraw platform fees to `wallet_address`, on chain."""
        body = {"amount": str(amount), "wallet_address": wallet_address,
                "idempotency_key": idempotency_key}  # fmt: skip
        return self._json("POST", "operator/fees", json=body)

    def payout_proof(self, payout_id: int) -> dict[str, Any]:
        """The Merkle proof for the escrow's claim() of a payout, withdrawal or fee payout."""
        return self._json("GET", f"payouts/{payout_id}/proof")

    def contributions(self, node_id: int, batch: str | None = None) -> dict[str, Any]:
        """What each settlement batch credited the node with, each with its Merkle proof."""
        params = {"batch": batch} if batch else None
        return self._json("GET", f"nodes/{node_id}/contributions", params=params)

    def tracking(self, job_id: str) -> dict[str, Any]:
        """Params and per-round metrics, as the experiment trackers log them."""
        return self._json("GET", f"jobs/{job_id}/tracking")

    def download(
        self,
        job_id: str,
        directory: str | Path = ".",
        fmt: str = "safetensors",
        *,
        wait: float = EXPORT_WAIT_S,
    ) -> tuple[Path, Path]:
        """Write the model (JOB.safetensors, JOB.onnx, JOB.torchscript.pt, or the folder
        JOB-hf/ for hf) and JOB.provenance.json into `directory`, waiting up to `wait`
        seconds for an export the server makes on first request (model_bytes)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        data = self.model_bytes(job_id, fmt, wait=wait)
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


def server_url(server: str | None = None) -> str:
    """The marketplace a client talks to: `server`, else $GPUFLEX_SERVER, else the local
    default (DEFAULT_SERVER)."""
    return (server or os.environ.get("GPUFLEX_SERVER") or DEFAULT_SERVER).rstrip("/")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while piece := fh.read(2**20):
            digest.update(piece)
    return digest.hexdigest()


def _unzip_flat(data: bytes, folder: Path) -> None:
    """The HF folder's files, by their base names only: a zip cannot write outside `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            name = Path(info.filename).name
            if info.is_dir() or not name:
                continue
            (folder / name).write_bytes(zf.read(info))


def _retry_after(response: httpx.Response) -> float:
    """The pause a 202's Retry-After asks for (seconds; an HTTP date or none: 5 s), bounded."""
    try:
        seconds = float(response.headers.get("Retry-After", "5"))
    except ValueError:
        seconds = 5.0
    low, high = RETRY_AFTER_BOUNDS_S
    return min(max(seconds, low), high)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        code, detail = body.get("error", "error"), body.get("detail", response.text)
    except ValueError:
        body, code, detail = None, "error", response.text[:500]
    raise GPUFlexError(response.status_code, code, detail, body)


def sse_messages(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) for each Server-Sent Events message in `lines` (the WHATWG rules the
    server needs: `event`, multi-line `data`, comments and `id`/`retry` ignored)."""
    event, data = "message", []
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)


def spec_files(spec_path: Path, federated: bool = False) -> dict[str, Path]:
    """{upload field: path} for the files a spec file names that exist beside it: its
    dataset (unless built in, or federated: the nodes hold that), tokenizer.json, and an
    hf_* model's config.json and checkpoint. A spec that does not parse names none here;
    the server reports its problems."""
    return {field: path for field, path in _named_files(spec_path, federated).items()
            if path.is_file()}  # fmt: skip


def missing_spec_files(spec_path: Path, federated: bool = False) -> dict[str, Path]:
    """{spec field: path} for the files a spec file names that are not beside it (a dataset
    moved or not written yet): `gpuflex submit` names them before sending anything."""
    fields = {"dataset": "dataset.path", "dataset_tokenizer": "dataset.tokenizer",
              "model_config": "model.config", "model_checkpoint": "model.checkpoint",
              "model_program": "model.program"}  # fmt: skip
    named = _named_files(spec_path, federated)
    return {fields[f]: path for f, path in named.items() if not path.is_file()}


def _named_files(spec_path: Path, federated: bool) -> dict[str, Path]:
    from trainer.spec import SpecError, load_spec

    try:
        spec = load_spec(spec_path)
    except SpecError:
        return {}
    named = {
        "dataset": None if federated or spec.dataset.kind == "digits" else spec.dataset.path,
        "dataset_tokenizer": spec.dataset.tokenizer,
        "model_config": spec.model.config if isinstance(spec.model.config, str) else None,
        "model_checkpoint": spec.model.checkpoint,
        "model_program": spec.model.program,
    }
    return {field: (spec_path.parent / name).expanduser()
            for field, name in named.items() if name}  # fmt: skip
