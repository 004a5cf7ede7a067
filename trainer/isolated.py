"""Run what reads a buyer's files through native libraries in a child process of its own.

A tokenizer.json is run by `tokenizers` (Rust): a regex normalizer with catastrophic
backtracking panics it (`retry-limit-in-match`), and the panic is a BaseException that no
`except Exception` catches, or an abort. A config.json is built by `transformers`: a config
with 10,000 layers takes minutes and gigabytes. Either kills, or holds, the process it runs in.
So the worker that prepares a job does these steps here instead, in a fresh interpreter
(`python -m trainer.isolated STEP FOLDER`) under an address-space limit (RLIMIT_AS), a CPU-time
limit (RLIMIT_CPU) and a wall-clock timeout: what goes wrong ends the child, and the caller
gets an IsolatedError saying what happened, to fail the job with.

Nothing crosses back as a pickle: the child writes `result.json` and, for tensors, safetensors
files in FOLDER, which the caller parses. Steps:

- `dataset`: load_dataset on a DatasetSpec (paths inside the request); writes dataset.safetensors
  and the Dataset's other fields in result.json.
- `footprint`: trainer.fit.measure_footprint on the meta device (a checkpoint checked by its
  header); result.json holds the Footprint.
- `model`: build_model with the seed (and the checkpoint's weights); writes model.safetensors.

No Django here (trainer/ never imports it); the marketplace passes the limits in.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUEST = "request.json"
RESULT = "result.json"
STDERR = "stderr.log"
# a result is a few numbers and names; anything longer is not ours
_MAX_RESULT_BYTES = 2**20
DATASET_TENSORS = "dataset.safetensors"
MODEL_TENSORS = "model.safetensors"
_TENSOR_FIELDS = ("x_train", "y_train", "x_test", "y_test", "lengths_train", "lengths_test",
                  "rows_train", "rows_test")  # fmt: skip
# what the caller quotes of a crashed child's stderr (a Rust panic's first lines say why)
_STDERR_TAIL = 4000


class IsolatedError(Exception):
    """The step failed; `reason` says why in words a buyer can act on. `kind`: "dataset",
    "too_large" or "model" for the step's own refusal of the input (a DatasetError, an
    ArchiveTooLarge, a ModelSpecError); "crash", "memory" or "time" for a child that raised
    something else (a Rust panic), crashed, or ran out of memory or time."""

    def __init__(self, reason: str, *, kind: str) -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind


@dataclass(frozen=True)
class Limits:
    memory_bytes: int  # the child's address space, interpreter and libraries included
    seconds: float  # wall clock; CPU time is limited to the same


def run_step(step: str, request: Mapping[str, Any], folder: Path, limits: Limits) -> dict:
    """Run `step` on `request` (JSON) in a child confined to `limits`; its result.json.
    `folder` is the child's to write in (the caller's temporary folder)."""
    folder = Path(folder)
    (folder / REQUEST).write_text(json.dumps(request), encoding="utf-8")
    (folder / RESULT).unlink(missing_ok=True)
    cpu = max(1, int(limits.seconds))

    def confine() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file

    env = dict(os.environ)
    # one thread each: the limits hold for the whole child, and small steps need no pool
    env |= {"RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "RUST_BACKTRACE": "0",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    # stderr to a file, of which only the tail is read: a chatty child costs us no memory
    with (folder / STDERR).open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.isolated", step, str(folder)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
            preexec_fn=confine,  # rlimits are set in the child, before it runs anything
            start_new_session=True,  # its own process group: a timeout kills all of it
        )  # fmt: skip
        try:
            proc.wait(timeout=limits.seconds)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            raise IsolatedError(
                f"it ran past the {limits.seconds:g} s limit and was stopped", kind="time"
            ) from None
    result = _read_result(folder)
    if proc.returncode == 0 and result is not None:
        if "error" in result:
            raise IsolatedError(str(result["error"]), kind=str(result.get("kind", "crash")))
        return result
    kind, reason = _crash_reason(proc.returncode, _tail(folder / STDERR), limits)
    raise IsolatedError(reason, kind=kind)


def _tail(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _STDERR_TAIL))
        return f.read()


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_result(folder: Path) -> dict | None:
    try:
        with (folder / RESULT).open("rb") as f:
            data = json.loads(f.read(_MAX_RESULT_BYTES + 1)[:_MAX_RESULT_BYTES])
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _crash_reason(code: int, stderr: bytes, limits: Limits) -> tuple[str, str]:
    """(kind, reason) of a child that died without its result."""
    text = stderr.decode("utf-8", errors="replace")
    if code == -signal.SIGXCPU:
        return "time", f"it used more than the {limits.seconds:g} s CPU limit and was stopped"
    # Python's MemoryError, Rust's "memory allocation of N bytes failed", C++'s bad_alloc,
    # OpenBLAS's "Memory allocation still failed", glibc's "Cannot allocate memory", and the
    # dynamic loader's "failed to map segment" (a library mapped past the address space)
    words = ("memoryerror", "memory allocation", "bad_alloc", "cannot allocate memory",
             "failed to map segment")  # fmt: skip
    if any(word in text.lower() for word in words):
        return "memory", f"it needed more than the {limits.memory_bytes // 2**20} MiB memory limit"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # a Rust panic's message is the line after "panicked at …"; else the last line written
    said = next((lines[i + 1] for i, line in enumerate(lines[:-1]) if "panicked at" in line),
                lines[-1] if lines else "")  # fmt: skip
    how = f"exit status {code}"
    if code < 0:
        with contextlib.suppress(ValueError):
            how = f"signal {signal.Signals(-code).name}"
    return "crash", f"it crashed ({how}){': ' + said[:300] if said else ''}"


def read_dataset(folder: Path, result: Mapping[str, Any]) -> Any:
    """The Dataset a `dataset` step wrote to `folder` (safetensors and JSON, parsed here)."""
    import safetensors.torch

    from trainer.datasets import Dataset

    tensors = safetensors.torch.load_file(str(Path(folder) / DATASET_TENSORS))
    return Dataset(
        name=str(result["name"]), task=result["task"], num_classes=int(result["num_classes"]),
        input_shape=tuple(int(n) for n in result["input_shape"]),
        **{name: tensors.get(name) for name in _TENSOR_FIELDS},
    )  # fmt: skip


def read_model(folder: Path) -> dict[str, Any]:
    """The state dict a `model` step wrote to `folder`."""
    import safetensors.torch

    return safetensors.torch.load_file(str(Path(folder) / MODEL_TENSORS))


# -- in the child ----------------------------------------------------------------------------


def _dataset(request: dict, folder: Path) -> dict:
    import safetensors.torch

    from trainer.datasets import ArchiveLimits, ArchiveTooLarge, load_dataset
    from trainer.spec import DatasetSpec

    limits = request.get("archive_limits")
    spec = DatasetSpec.model_validate(request["dataset"])
    try:
        data = load_dataset(spec, seed=int(request["seed"]),
                            archive_limits=ArchiveLimits(**limits) if limits else None)  # fmt: skip
    except ArchiveTooLarge as exc:
        return {"error": str(exc), "kind": "too_large"}
    tensors = {name: getattr(data, name).contiguous() for name in _TENSOR_FIELDS
               if getattr(data, name) is not None}  # fmt: skip
    safetensors.torch.save_file(tensors, str(folder / DATASET_TENSORS))
    return {"name": data.name, "task": data.task, "num_classes": data.num_classes,
            "input_shape": list(data.input_shape)}  # fmt: skip


def _model_inputs(request: dict) -> tuple[Any, tuple[int, ...], int]:
    from trainer.spec import ModelSpec

    spec = ModelSpec.model_validate(request["model"])
    return spec, tuple(int(n) for n in request["input_shape"]), int(request["num_classes"])


def _footprint(request: dict, folder: Path) -> dict:
    from trainer.fit import measure_footprint
    from trainer.models import meta_weights

    spec, shape, classes = _model_inputs(request)
    checkpoint = request.get("checkpoint")
    weights = meta_weights(Path(checkpoint)) if checkpoint else None
    footprint = measure_footprint(spec, shape, classes, bool(request["lm"]), weights)
    return {"footprint": footprint.to_dict()}


def _model(request: dict, folder: Path) -> dict:
    import safetensors.torch

    from trainer.models import build_model, read_weights

    spec, shape, classes = _model_inputs(request)
    checkpoint = request.get("checkpoint")
    weights = read_weights(Path(checkpoint).read_bytes()) if checkpoint else None
    model = build_model(spec, shape, classes, seed=int(request["seed"]), weights=weights)
    # cloned: tied tensors (an LM head and its embeddings) are stored once each
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(folder / MODEL_TENSORS))
    return {"tensors": len(state)}


STEPS = {"dataset": _dataset, "footprint": _footprint, "model": _model}


def _child(step: str, folder: Path) -> int:
    from trainer.datasets import DatasetError
    from trainer.models import ModelSpecError

    request = json.loads((folder / REQUEST).read_text(encoding="utf-8"))
    try:
        result = STEPS[step](request, folder)
    except DatasetError as exc:
        result = {"error": str(exc), "kind": "dataset"}
    except (ModelSpecError, ValueError) as exc:  # HFModelError is a ValueError
        result = {"error": str(exc), "kind": "model"}
    except MemoryError:
        result = {"error": "it needed more memory than its limit", "kind": "memory"}
    except RuntimeError as exc:  # torch's allocator says so in a RuntimeError
        memory = "allocate memory" in str(exc)
        said = "it needed more memory than its limit" if memory else f"it failed: {exc}"[:500]
        result = {"error": said, "kind": "memory" if memory else "crash"}
    except BaseException as exc:  # a Rust panic (pyo3's PanicException) is no Exception
        result = {"error": f"it crashed: {type(exc).__name__}: {exc}"[:500], "kind": "crash"}
    (folder / RESULT).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], Path(sys.argv[2])))
