"""An exported program, read by archive.py and passed by gate.py, as a trainable module.

The graph goes through torch's own JSON deserializer (torch._export.serde), with the
weights and constants this module builds from their raw bytes, and with what the graph
does not need to train left out: node metadata (stack traces, module paths) and guards
(Python source that `ExportedProgram.module()` would compile). Sample inputs are never
read. The module's parameters keep their names, so its state dict is the program's:
updates, codecs, DP and secure aggregation see plain named tensors, as for zoo models.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.exported.archive import Archive, Payload, read_archive
from trainer.exported.gate import ProgramSummary, check_program
from trainer.exported.runtime import install_modes

# a program's archive may hold fp32 weights of the largest model a tier allows, and this
MAX_PROGRAM_SLACK = 64 * 2**20


def _dtype(code: int) -> torch.dtype:
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    return _SERIALIZE_TO_TORCH_DTYPE[ScalarType(code)]


def _ints(values: list[dict[str, Any]]) -> list[int]:
    return [int(v["as_int"]) for v in values]


def _tensor(payload: Payload, meta_device: bool) -> torch.Tensor:
    """The payload's tensor (its own copy of the bytes), or an empty meta tensor of its
    shape; gate.check_program has checked the bytes cover its strides."""
    meta = payload.meta
    dtype, sizes = _dtype(meta["dtype"]), _ints(meta["sizes"])
    if meta_device:
        return torch.empty(sizes, dtype=dtype, device="meta")
    flat = torch.frombuffer(bytearray(payload.data), dtype=torch.uint8).view(dtype)
    strided = flat.as_strided(sizes, _ints(meta["strides"]), int(meta["storage_offset"]["as_int"]))
    return strided.clone(memory_format=torch.contiguous_format)


def _bare(program: dict[str, Any]) -> dict[str, Any]:
    """The program without what training does not need and should not be parsed: node
    metadata, the graph's metadata and the guards' source."""
    out = copy.copy(program)
    gm = copy.copy(program["graph_module"])
    graph = copy.copy(gm["graph"])
    graph["nodes"] = [{**node, "metadata": {}} for node in graph["nodes"]]
    gm["graph"] = graph
    gm["metadata"] = {}
    out["graph_module"] = gm
    out["guards_code"] = []
    return out


def load_exported(archive: Archive, *, meta_device: bool = False) -> torch.export.ExportedProgram:
    """The archive's ExportedProgram (checked by the gate first)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    summary = check_program(archive)
    state: dict[str, torch.Tensor] = {}
    for name, payload in archive.weights.items():
        tensor = _tensor(payload, meta_device)
        if name in summary.counters:  # floating, as every tensor an update carries
            tensor = tensor.float()
        state[name] = nn.Parameter(tensor) if payload.is_param else tensor
    constants = {name: _tensor(p, meta_device) for name, p in archive.constants.items()}
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, _bare(archive.program))
        return ExportedProgramDeserializer().deserialize(serialized, state, constants, ((), {}))
    except Exception as exc:  # the serde raises many kinds for a malformed graph
        from trainer.exported.gate import GateError

        raise GateError(f"the program's graph cannot be read: {type(exc).__name__}: "
                        f"{str(exc)[:300]}") from None  # fmt: skip


def load_program(archive: Archive, *, meta_device: bool = False) -> nn.Module:
    """A module that runs the program: forward(inputs, targets) -> loss or (loss, logits),
    with train()/eval() switching its dropout and batch norm (runtime.install_modes)."""
    # no guards: their source is the buyer's (dropped), and input shapes are ours
    module = load_exported(archive, meta_device=meta_device).module(check_guards=False)
    # The hooks unlifting installs re-check every call's inputs against the range
    # constraints (in Python, about as long as a small model's forward: bench/exported_bench)
    # and switch on nn.Module graph inputs, which the gate refuses. The trainer feeds the
    # program only the dataset's batches, whose shape the gate checked against it.
    module._forward_pre_hooks.clear()
    module._forward_hooks.clear()
    # forward(x, y) -> its outputs as a tuple, without the pytree flattening of the inputs
    # and outputs on every call (the gate allows two tensor inputs and tensor outputs only)
    module.graph.set_codegen(torch.fx.graph.CodeGen())
    module.recompile()
    return install_modes(module)


@functools.lru_cache(maxsize=4)
def _cached_archive(path: str, mtime_ns: int, size: int, max_bytes: int) -> Archive:
    return read_archive(Path(path), max_bytes)


def archive_at(path: Path | str, max_bytes: int) -> Archive:
    """The archive at `path`, read once per file version (a node builds the model each
    task; the file does not change under it)."""
    stat = Path(path).stat()
    return _cached_archive(str(path), stat.st_mtime_ns, stat.st_size, max_bytes)


def summarize(archive: Archive) -> ProgramSummary:
    return check_program(archive)


# the simulator and agents read a program of at most this size (the marketplace's cap on
# what it accepts is the job's model cap: jobs/model_files.py)
MAX_PROGRAM_BYTES = 4 * 2**30


def program_module(path: Path | str, input_shape: tuple[int, ...]) -> nn.Module:
    """The program at `path`, checked by the gate and against the dataset's input shape,
    on the meta device when that is the default device (a footprint's measurement), else
    on the CPU with its weights. GateError / ArchiveError name what is wrong."""
    from trainer.exported.gate import check_fits_data

    archive = archive_at(path, MAX_PROGRAM_BYTES)
    summary = check_program(archive)
    check_fits_data(summary, input_shape, summary.integer_input)
    meta = torch.get_default_device().type == "meta"
    with torch.device("cpu"):
        module = load_program(archive, meta_device=meta)
    module.gpuflex_summary = summary  # type: ignore[assignment]
    return module


def sample_batch(module: nn.Module, input_shape: tuple[int, ...], device: Any = None):
    """One sample's (inputs, targets) as the program takes them: zeros of its dtypes."""
    summary: ProgramSummary = module.gpuflex_summary  # type: ignore[assignment]
    x_dtype = torch.long if summary.integer_input else torch.float32
    x = torch.zeros((1, *input_shape), dtype=x_dtype, device=device)
    y = torch.zeros((1, *summary.target_shape), dtype=torch.long, device=device)
    return x, y


def largest_tensor_bytes(path: Path | str, input_shape: tuple[int, ...]) -> int:
    """The largest tensor any operator of the program makes for one sample, forward and
    backward, measured on the meta device (nothing allocated). Saved activations
    (trainer.fit) miss a transient `aten.full` of any size; this does not."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    largest = 0

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            nonlocal largest
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    largest = max(largest, t.numel() * t.element_size())
            return out

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        module = program_module(path, input_shape)
        x, y = sample_batch(module, input_shape)
        with Sizes():
            loss = module(x, y)[0]
            if loss.requires_grad:
                loss.backward()
    return largest
