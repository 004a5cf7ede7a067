"""The submission gate for an exported program: what its JSON says, checked without torch.

Runs in the web request (standard library only), so that a hostile program is a 400 that
names the problem before anything is stored; what needs torch (the parameter count and one
sample's activation memory, measured on the meta device) runs in the worker (loader.py).

- every operator on ALLOWED_OPS: PyTorch's own ATen operators that compute, never a custom
  op (whose kernel would be the buyer's code), never I/O such as aten::from_file, never a
  higher-order op carrying a subgraph;
- at most MAX_NODES nodes, MAX_CONSTANTS constants of MAX_CONSTANT_BYTES in all;
- two inputs, the dataset's batch (inputs and targets), each with a dynamic first dimension
  shared by both, so that a node may train any batch size; one or two outputs (the loss,
  and optionally the logits for accuracy);
- plain strided floating or integer tensors, sizes within the archive, and symbolic
  expressions that are arithmetic on size symbols only (torch parses them with sympy).

The graph's metadata (stack traces, module paths) and its guards (Python source) are not
needed to train and are never deserialized (loader.py drops them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from trainer.exported.archive import Archive, Payload

MAX_NODES = 20_000
MAX_CONSTANTS = 256
MAX_CONSTANT_BYTES = 16 * 2**20
MAX_RANK = 8

# ATen operators by name (any overload): what models and losses compute with. Nothing here
# reads or writes files, talks to the network, or calls back into Python.
ALLOWED_OPS = frozenset({
    "linear", "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "batch_norm", "layer_norm", "group_norm",
    "instance_norm", "rms_norm", "dropout", "feature_dropout", "alpha_dropout",
    "native_dropout", "relu", "relu_", "gelu", "silu", "sigmoid", "tanh", "hardtanh",
    "hardtanh_", "leaky_relu", "elu", "selu", "celu", "softplus", "mish", "hardswish",
    "hardsigmoid", "prelu", "glu", "softmax", "log_softmax", "_softmax", "_log_softmax",
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_bilinear2d", "upsample_linear1d",
    "pixel_shuffle", "pixel_unshuffle", "embedding", "scaled_dot_product_attention",
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "t", "dot", "outer",
    "broadcast_tensors", "broadcast_to", "cross_entropy_loss", "nll_loss", "nll_loss_nd",
    "nll_loss2d", "mse_loss", "l1_loss",
    "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "cosine_similarity", "view", "reshape",
    "_unsafe_view", "flatten", "unflatten", "permute", "transpose", "contiguous", "expand",
    "expand_as", "squeeze", "unsqueeze", "cat", "stack", "split", "split_with_sizes",
    "chunk", "slice", "select", "index", "index_select", "gather", "narrow", "repeat",
    "tile", "clone", "detach", "alias", "flip", "roll", "pad", "constant_pad_nd", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "arange", "empty_like",
    "new_zeros", "new_ones", "new_full", "to", "_to_copy", "type_as", "where",
    "masked_fill", "tril", "triu", "lift_fresh_copy", "scalar_tensor", "one_hot", "eq",
    "ne", "gt", "lt", "ge", "le", "logical_and", "logical_or", "logical_not", "bitwise_not",
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "exp", "log", "log1p", "log2", "sqrt",
    "rsqrt", "pow", "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "mean", "sum",
    "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "norm",
    "linalg_vector_norm", "cumsum", "sign", "floor", "ceil", "round", "reciprocal",
    "square", "cos", "sin", "erf", "add_", "sub_", "mul_", "copy_", "zero_", "fill_",
    "sym_size", "sym_numel", "sym_stride", "_assert_tensor_metadata", "_assert_scalar",
})  # fmt: skip
# the arithmetic on sizes that a dynamic batch puts in a graph (x.view(-1, ...))
ALLOWED_SYM_OPS = frozenset({
    "_operator.add", "_operator.sub", "_operator.mul", "_operator.floordiv",
    "_operator.truediv", "_operator.mod", "_operator.neg", "_operator.getitem",
})  # fmt: skip
_ATEN = "torch.ops.aten."

# schema.ScalarType: the dtypes a weight, constant or input may have
FLOATING = {6: "float16", 7: "float32", 8: "float64", 13: "bfloat16"}
INTEGER = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 12: "bool"}
ELEMENT_SIZE = {6: 2, 7: 4, 8: 8, 13: 2, 1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 12: 1}
STRIDED = 7

# sympy text as torch writes it: Symbol('s17', positive=True, integer=True), numbers,
# arithmetic and torch's own size functions; sympify evaluates this, so nothing else passes
_EXPR_TOKEN = re.compile(
    r"\s+|\d+|'[a-z]\d{1,9}'|[-+*/%(),=]|"
    r"(Symbol|Integer|positive|integer|True|False|FloorDiv|CeilDiv|CleanDiv|Mod|PythonMod|"
    r"Max|Min|CeilToInt|FloorToInt|IntTrueDiv|TruncToInt|PowByNatural|[a-z]\d{1,9})\b"
)


class GateError(ValueError):
    """A program the marketplace refuses; `field` is the spec field it concerns."""

    def __init__(self, reason: str, field: str = "model.program") -> None:
        self.field = field
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class ProgramSummary:
    """What the gate read from a program, for the checks that need the dataset or torch."""

    nodes: int
    operators: frozenset[str]
    parameters: int  # elements of the weights marked as parameters
    state_bytes: int  # parameters and buffers, as stored
    constant_bytes: int
    input_shape: tuple[int, ...]  # the inputs' shape after the batch dimension
    integer_input: bool  # token ids rather than features
    target_shape: tuple[int, ...]  # the targets' shape after the batch dimension
    returns_logits: bool
    # integer buffers only ever incremented (batch norm's num_batches_tracked): they load as
    # float32, as every state tensor that travels in an update is floating
    counters: frozenset[str] = frozenset()


# what a counter buffer may go through: incremented in place, nothing else
_COUNTER_OPS = {"torch.ops.aten.add_.Tensor", "torch.ops.aten.add_.Scalar"}


def check_program(archive: Archive) -> ProgramSummary:
    """The program's summary, or GateError naming the operator or limit it breaks."""
    try:
        return _check(archive)
    except GateError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, StopIteration) as exc:
        # JSON of the right kinds in the wrong places: a 400, never a server error
        raise GateError(f"the program's graph is malformed ({type(exc).__name__}: "
                        f"{str(exc)[:200]})") from None  # fmt: skip


def _check(archive: Archive) -> ProgramSummary:
    program = archive.program
    gm = _mapping(program.get("graph_module"), "graph_module")
    graph = _mapping(gm.get("graph"), "graph_module.graph")
    nodes = graph.get("nodes")
    if not isinstance(nodes, list):
        raise GateError("the program's graph has no node list")
    if len(nodes) > MAX_NODES:
        raise GateError(f"the program's graph has {len(nodes):,} nodes; the limit is "
                        f"{MAX_NODES:,}")  # fmt: skip
    ops = set()
    for node in nodes:
        target = node.get("target") if isinstance(node, dict) else None
        if not isinstance(target, str):
            raise GateError("a node of the program's graph has no operator")
        _check_op(target)
        ops.add(target)
    if graph.get("custom_obj_values"):
        raise GateError("the program holds custom objects (script objects), which never run")
    _check_exprs(program)
    signature = _mapping(gm.get("signature"), "graph_module.signature")
    user_inputs = _inputs(signature)
    outputs = _outputs(signature)
    tensors = _mapping(graph.get("tensor_values"), "graph.tensor_values")
    x, y = (_mapping(tensors.get(name), f"tensor_values.{name}") for name in user_inputs)
    x_shape = _batched(x, user_inputs[0])
    y_shape = _batched(y, user_inputs[1])
    if x["sizes"][0] != y["sizes"][0]:
        raise GateError("the inputs and targets must share their batch dimension (one "
                        "torch.export.Dim for both)")  # fmt: skip
    if y.get("dtype") not in INTEGER and y.get("dtype") not in FLOATING:
        raise GateError("the targets' dtype is neither integer nor floating")
    if x.get("dtype") not in INTEGER and x.get("dtype") not in FLOATING:
        raise GateError("the inputs' dtype is neither integer nor floating")
    for payload in archive.weights.values():
        _check_payload(payload, "weight")
    constant_bytes = 0
    if len(archive.constants) > MAX_CONSTANTS:
        raise GateError(f"the program has {len(archive.constants):,} constants; the limit is "
                        f"{MAX_CONSTANTS:,}")  # fmt: skip
    for payload in archive.constants.values():
        constant_bytes += _check_payload(payload, "constant")
    if constant_bytes > MAX_CONSTANT_BYTES:
        raise GateError(f"the program's constants hold {constant_bytes:,} bytes; the limit is "
                        f"{MAX_CONSTANT_BYTES:,}")  # fmt: skip
    _check_named(signature, archive)
    counters = _counters(signature, nodes, archive)
    return ProgramSummary(
        counters=counters,
        nodes=len(nodes),
        operators=frozenset(ops),
        parameters=sum(_numel(p.meta) for p in archive.weights.values() if p.is_param),
        state_bytes=sum(4 * _numel(p.meta) for p in archive.weights.values()),
        constant_bytes=constant_bytes,
        input_shape=x_shape,
        integer_input=x.get("dtype") in INTEGER,
        target_shape=y_shape,
        returns_logits=len(outputs) == 2,
    )


def check_fits_data(
    summary: ProgramSummary, input_shape: tuple[int, ...], integer_input: bool
) -> None:
    """The program takes the dataset's batch as the zoo models receive it."""
    if summary.input_shape != tuple(input_shape):
        raise GateError(f"the program takes inputs of shape [B, {_dims(summary.input_shape)}]; "
                        f"the dataset's are [B, {_dims(input_shape)}]")  # fmt: skip
    if summary.integer_input != integer_input:
        want = "integer token ids" if integer_input else "floating features"
        raise GateError(f"the dataset's inputs are {want}; the program takes the other kind")


def _dims(shape: tuple[int, ...]) -> str:
    return ", ".join(str(d) for d in shape)


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise GateError(f"the program's {what} is missing or not a mapping")
    return value


def _check_op(target: str) -> None:
    if target in ALLOWED_SYM_OPS:
        return
    if target.startswith(_ATEN):
        name = target[len(_ATEN) :].split(".", 1)[0]
        if name in ALLOWED_OPS:
            return
        raise GateError(f"operator aten::{name} ({target}) is not on the allow-list of ATen "
                        "operators (docs/job-spec.md)")  # fmt: skip
    shown = target.removeprefix("torch.ops.").replace(".", "::", 1)
    raise GateError(f"operator {shown} ({target}) is not an ATen operator: custom and "
                    "higher-order operators never run on a node")  # fmt: skip


def _check_exprs(value: Any) -> None:
    """Every symbolic expression in the program (sizes, range constraints) is plain size
    arithmetic: torch's deserializer hands them to sympy, which evaluates them."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, sub in item.items():
                if key == "expr_str" and not _is_size_expr(sub):
                    raise GateError(f"the program has a symbolic size {str(sub)[:80]!r} that is "
                                    "not arithmetic on sizes")  # fmt: skip
                stack.append(sub)
        elif isinstance(item, list):
            stack.extend(item)
    for key in _mapping(value.get("range_constraints", {}), "range_constraints"):
        if not _is_size_expr(key):
            raise GateError(f"the program has a range constraint on {key[:80]!r}, not a size")


def _is_size_expr(text: Any) -> bool:
    if not isinstance(text, str) or len(text) > 2000:
        return False
    pos = 0
    while pos < len(text):
        match = _EXPR_TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            return False
        pos = match.end()
    return True


def _inputs(signature: dict[str, Any]) -> list[str]:
    names = []
    for spec in signature.get("input_specs") or []:
        kind = next(iter(spec), None) if isinstance(spec, dict) else None
        if kind in ("parameter", "buffer", "tensor_constant"):
            continue
        if kind != "user_input":
            raise GateError(f"the program takes a {kind} input; it takes only tensors "
                            "(the batch), parameters, buffers and tensor constants")  # fmt: skip
        arg = spec["user_input"].get("arg") or {}
        if "as_tensor" not in arg:
            raise GateError("every input of the program is a tensor: inputs and targets")
        names.append(arg["as_tensor"]["name"])
    if len(names) != 2:
        raise GateError(f"the program takes {len(names)} inputs; it takes the dataset's batch, "
                        "forward(inputs, targets)")  # fmt: skip
    return names


def _outputs(signature: dict[str, Any]) -> list[str]:
    names = []
    for spec in signature.get("output_specs") or []:
        kind = next(iter(spec), None) if isinstance(spec, dict) else None
        if kind == "buffer_mutation":  # batch norm's running statistics
            continue
        if kind != "user_output":
            raise GateError(f"the program has a {kind} output; it returns the loss, or "
                            "(loss, logits)")  # fmt: skip
        names.append(str(spec[kind].get("arg")))
    if len(names) not in (1, 2):
        raise GateError(f"the program returns {len(names)} values; it returns the loss, or "
                        "(loss, logits)")  # fmt: skip
    return names


def _batched(meta: dict[str, Any], name: str) -> tuple[int, ...]:
    """The shape after the first dimension, which must be symbolic: the batch."""
    sizes = meta.get("sizes")
    if not isinstance(sizes, list) or not sizes or len(sizes) > MAX_RANK:
        raise GateError(f"input {name!r} has no batch dimension")
    if "as_expr" not in sizes[0]:
        raise GateError(f"input {name!r} has no dynamic batch dimension: export with "
                        "dynamic_shapes={0: torch.export.Dim('batch')} for each input")  # fmt: skip
    rest = []
    for dim in sizes[1:]:
        if not isinstance(dim, dict) or not isinstance(dim.get("as_int"), int):
            raise GateError(f"input {name!r}: only its first (batch) dimension is dynamic")
        rest.append(dim["as_int"])
    return tuple(rest)


def _numel(meta: dict[str, Any]) -> int:
    sizes = meta.get("sizes")
    if not isinstance(sizes, list) or len(sizes) > MAX_RANK:
        raise GateError("a tensor of the program has no static shape")
    dims = []
    for dim in sizes:
        value = dim.get("as_int") if isinstance(dim, dict) else None
        if not isinstance(value, int) or value < 0:
            raise GateError("a weight or constant of the program has a dynamic or negative size")
        dims.append(value)
    return math.prod(dims)


def _check_payload(payload: Payload, what: str) -> int:
    """A plain strided tensor whose bytes hold what its meta says; its byte count."""
    meta = payload.meta
    dtype = meta.get("dtype")
    if dtype not in ELEMENT_SIZE:
        raise GateError(f"{what} {payload.name!r} has dtype code {dtype!r}; plain floating "
                        "and integer tensors only")  # fmt: skip
    if meta.get("layout", STRIDED) != STRIDED:
        raise GateError(f"{what} {payload.name!r} is not a plain (strided) tensor")
    numel = _numel(meta)
    strides = [s.get("as_int") if isinstance(s, dict) else None for s in meta.get("strides", [])]
    offset = (meta.get("storage_offset") or {}).get("as_int", 0)
    if (len(strides) != len(meta["sizes"]) or not all(isinstance(s, int) and s >= 0
                                                      for s in strides)
            or not isinstance(offset, int) or offset < 0):  # fmt: skip
        raise GateError(f"{what} {payload.name!r} has bad strides or offset")
    # the last element it reaches must lie inside its bytes
    dims = zip(meta["sizes"], strides, strict=True)
    extent = offset + sum((d["as_int"] - 1) * s for d, s in dims) + 1
    if numel and extent * ELEMENT_SIZE[dtype] > len(payload.data):
        raise GateError(f"{what} {payload.name!r} reaches past its {len(payload.data):,} bytes")
    return len(payload.data)


def _counters(signature: dict[str, Any], nodes: list[Any], archive: Archive) -> frozenset[str]:
    """The integer buffers, each of which must be a counter (see ProgramSummary.counters):
    an update is a floating delta, so an integer state tensor of any other use is refused."""
    ints = {}
    for spec in signature.get("input_specs") or []:
        if next(iter(spec)) == "buffer":
            name = spec["buffer"].get("buffer_name")
            if archive.weights[name].meta.get("dtype") in INTEGER:
                ints[spec["buffer"]["arg"]["name"]] = name
    if not ints:
        return frozenset()
    for node in nodes:
        for used in _tensor_names(node.get("inputs")):
            if used in ints and node["target"] not in _COUNTER_OPS:
                raise GateError(f"buffer {ints[used]!r} is an integer tensor used by "
                                f"{node['target']}: a model's state travels as floating "
                                "updates; make it a float buffer or a constant")  # fmt: skip
    return frozenset(ints.values())


def _tensor_names(value: Any) -> list[str]:
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            tensor = item.get("as_tensor")
            if isinstance(tensor, dict) and isinstance(tensor.get("name"), str):
                found.append(tensor["name"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _check_named(signature: dict[str, Any], archive: Archive) -> None:
    """Every parameter, buffer and constant the graph takes is in the archive's configs."""
    for spec in signature.get("input_specs") or []:
        kind = next(iter(spec))
        if kind in ("parameter", "buffer"):
            name = spec[kind].get(f"{kind}_name")
            if name not in archive.weights:
                raise GateError(f"the program's {kind} {name!r} has no stored weights")
        elif kind == "tensor_constant":
            name = spec[kind].get("tensor_constant_name")
            if name not in archive.constants:
                raise GateError(f"the program's constant {name!r} is not stored")
