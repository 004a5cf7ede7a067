"""The job spec: one YAML or JSON document that says everything about a training job.

Every part of GPUFlex (simulator, marketplace, contributor agent) reads jobs through
`load_spec` / `parse_spec`. The marketplace cannot run every spec that validates here: it
refuses the rest at submission, naming the field (docs/job-spec.md says which and why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainer.hf_limits import bound_problems
from trainer.nesting import TooDeep, loads_json, loads_yaml
from trainer.sweep_space import SweepSpec, apply_params, corner_params


class SpecError(ValueError):
    """A job spec that cannot be used; `problems` lists (field path, reason) pairs."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "spec") -> None:
        self.problems = problems
        self.source = source
        lines = "\n".join(f"  {path}: {reason}" for path, reason in problems)
        super().__init__(f"invalid job spec ({source}):\n{lines}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DatasetKind = Literal["digits", "csv", "npz", "parquet", "image_folder", "text"]


class DatasetSpec(_Strict):
    kind: DatasetKind = "digits"
    path: str | None = Field(default=None, description="file or folder for user datasets")
    label_column: str = "label"
    test_fraction: Annotated[float, Field(gt=0.0, lt=0.9)] = 0.2
    image_size: Annotated[int, Field(ge=4, le=512)] = 28
    seq_len: Annotated[int, Field(ge=2, le=4096)] = 64
    # text: a Hugging Face tokenizer.json (relative to the spec file; the marketplace takes
    # it as an upload). None: byte-level tokens, a vocabulary of the 256 byte values.
    tokenizer: Annotated[str, Field(min_length=1, max_length=1000)] | None = None

    @model_validator(mode="after")
    def _path_for_user_data(self) -> DatasetSpec:
        if self.kind != "digits" and not self.path:
            raise ValueError(f"dataset kind '{self.kind}' needs a 'path'")
        if self.tokenizer is not None and self.kind != "text":
            raise ValueError(f"'tokenizer' is for dataset kind 'text', not '{self.kind}'")
        return self


# Architectures whose model is a Hugging Face `transformers` class built from a config.json
HF_ARCHS = frozenset({"hf_causal_lm", "hf_seq_cls"})
# a config.json is a few KiB; more is not a model description
MAX_HF_CONFIG_BYTES = 64 * 1024
_MODULE_NAME = r"^[A-Za-z0-9_.]{1,100}$"


class LoraSpec(_Strict):
    """Low-rank adapters (peft's LoRA) on a frozen base: only the adapters train and travel."""

    r: Annotated[int, Field(ge=1, le=1024)] = 8
    alpha: Annotated[float, Field(gt=0.0, le=4096.0)] = 16.0
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    # module names (or name suffixes) to adapt; None: peft's default for the model type
    target_modules: (
        Annotated[
            list[Annotated[str, Field(pattern=_MODULE_NAME)]], Field(min_length=1, max_length=64)
        ]
        | None
    ) = None


class ModelSpec(_Strict):
    arch: Literal[
        "mlp", "cnn", "resnet", "transformer", "resnet18", "vit_s", "hf_causal_lm", "hf_seq_cls",
        "exported",
    ] = "mlp"  # fmt: skip
    # layer lists are bounded too: a million one-unit layers is a tiny model that takes
    # minutes just to construct
    hidden: Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(max_length=64)] = [128]
    channels: Annotated[list[Annotated[int, Field(ge=1, le=1024)]], Field(max_length=16)] = [16, 32]
    blocks: Annotated[int, Field(ge=1, le=16)] = 2
    d_model: Annotated[int, Field(ge=8, le=4096)] = 64
    n_layers: Annotated[int, Field(ge=1, le=48)] = 2
    n_heads: Annotated[int, Field(ge=1, le=64)] = 4
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    # Recompute each transformer/residual block's activations in the backward pass instead of
    # keeping them: about a third more compute for much less activation memory.
    checkpointing: bool = False
    # vit_s: the side of its square patches (16 for 224-pixel images; the image side must be
    # a multiple of it)
    patch_size: Annotated[int, Field(ge=1, le=64)] = 16
    # hf_*: the model's Hugging Face config.json, inline or as a path (relative to the spec
    # file); the marketplace stores it inline. Never fetched from a hub.
    config: dict[str, Any] | Annotated[str, Field(min_length=1, max_length=1000)] | None = None
    # initial weights: a safetensors file (relative to the spec file); for hf_* the base
    # model's own state dict, as `save_pretrained` writes it. None: fresh weights from the seed.
    checkpoint: Annotated[str, Field(min_length=1, max_length=1000)] | None = None
    lora: LoraSpec | None = None
    # exported: the buyer's `torch.export.save` archive (.pt2; relative to the spec file; the
    # marketplace takes it as an upload), its forward(inputs, targets) returning the loss or
    # (loss, logits); read and gated by trainer/exported, never unpickled
    program: Annotated[str, Field(min_length=1, max_length=1000)] | None = None

    @model_validator(mode="after")
    def _program_field(self) -> ModelSpec:
        if self.arch == "exported" and self.program is None:
            raise ValueError("arch 'exported' needs a 'program' (a torch.export .pt2 file)")
        if self.arch != "exported" and self.program is not None:
            raise ValueError(f"'program' is for arch 'exported', not '{self.arch}'")
        if self.arch == "exported" and self.checkpoint is not None:
            raise ValueError("an exported program carries its own weights: no 'checkpoint'")
        return self

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.arch == "transformer" and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        return self

    @model_validator(mode="after")
    def _hf_fields(self) -> ModelSpec:
        hf = self.arch in HF_ARCHS
        if hf and self.config is None:
            raise ValueError(f"arch '{self.arch}' needs a 'config' (its config.json)")
        if not hf and self.config is not None:
            raise ValueError(f"'config' is for the hf_* archs, not '{self.arch}'")
        if not hf and self.lora is not None:
            raise ValueError(f"'lora' is for the hf_* archs, not '{self.arch}'")
        if isinstance(self.config, dict):
            if not isinstance(self.config.get("model_type"), str):
                raise ValueError("the config needs its 'model_type' (e.g. 'gpt2', 'llama')")
            if "auto_map" in self.config:
                raise ValueError("'auto_map' names remote code, which never runs here")
            if len(json.dumps(self.config)) > MAX_HF_CONFIG_BYTES:
                raise ValueError(f"the config is larger than {MAX_HF_CONFIG_BYTES} bytes")
            # sizes no real model has, refused by arithmetic before any library builds it
            for field, reason in bound_problems(self.config)[:1]:
                raise ValueError(f"config.{field}: {reason}")
        return self


class LrScheduleSpec(_Strict):
    """How the learning rate moves over rounds (trainer.schedule.round_lr): each round's
    tasks train at that round's rate, constant through their local steps."""

    kind: Literal["constant", "cosine", "step"] = "constant"
    # rounds of linear warmup before the schedule proper: round r <= warmup_rounds trains at
    # lr x r / (warmup_rounds + 1)
    warmup_rounds: Annotated[int, Field(ge=0, le=100_000)] = 0
    # cosine: the rate at the last round, as a fraction of lr
    min_lr_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    # step: multiply by gamma every step_rounds rounds after the warmup
    step_rounds: Annotated[int, Field(ge=1, le=100_000)] = 10
    gamma: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5


class OptimizerSpec(_Strict):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 0.1
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    schedule: LrScheduleSpec = LrScheduleSpec()


class LocalSpec(_Strict):
    steps: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    epochs: Annotated[float, Field(gt=0.0, le=1000.0)] | None = None
    batch_size: Annotated[int, Field(ge=1, le=65536)] = 32  # samples per optimizer step
    # "auto": bf16 on GPUs that have it, fp16 (with loss scaling) on older GPUs, fp32 on CPU/MPS
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # Split each step's batch into this many micro-batches (same gradient, less memory)
    grad_accum_steps: Annotated[int, Field(ge=1, le=1024)] = 1

    @model_validator(mode="after")
    def _one_of(self) -> LocalSpec:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of 'steps' or 'epochs'")
        return self

    @model_validator(mode="after")
    def _accum_fits_batch(self) -> LocalSpec:
        if self.grad_accum_steps > self.batch_size:
            raise ValueError(
                f"grad_accum_steps ({self.grad_accum_steps}) must not exceed batch_size "
                f"({self.batch_size}): each micro-batch needs at least one sample"
            )
        return self


class TargetSpec(_Strict):
    metric: Literal["accuracy", "loss"] = "accuracy"
    value: float

    @model_validator(mode="after")
    def _range(self) -> TargetSpec:
        if self.metric == "accuracy" and not 0.0 < self.value <= 1.0:
            raise ValueError("an accuracy target lies in (0, 1]")
        if self.metric == "loss" and self.value <= 0.0:
            raise ValueError("a loss target must be positive")
        return self


class EarlyStoppingSpec(_Strict):
    """Stop a job whose held-out `metric` has plateaued: `patience` rounds in a row without
    improving on the best round by more than `min_delta` (trainer.schedule.plateau_reason)."""

    metric: Literal["accuracy", "loss"] = "accuracy"
    patience: Annotated[int, Field(ge=1, le=100_000)] = 3
    min_delta: Annotated[float, Field(ge=0.0)] = 0.0


class RoundsSpec(_Strict):
    # "naive": naive synchronous data-parallel training, the baseline federated rounds are
    # measured against: one local step per round on every node, nothing compressed
    # (JobSpec._naive_rounds fixes the settings that make it so)
    mode: Literal["federated", "naive"] = "federated"
    max_rounds: Annotated[int, Field(ge=1, le=100_000)] = 50
    target: TargetSpec | None = None
    early_stopping: EarlyStoppingSpec | None = None
    deadline_s: Annotated[float, Field(gt=0.0)] | None = None
    quorum: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    late_updates: Literal["drop", "stale"] = "drop"
    # Anchor every round's provenance record on chain as the round closes (with the chain
    # enabled); without it only the completed job's head is anchored, which covers the whole
    # chain through its prev_hash links but proves nothing about a job that never completes.
    anchor_rounds: bool = False


# Strategies that average the updates weighted by their num_samples. The robust ones
# (trimmed_mean, median, krum) take unweighted order statistics on purpose, so that a node
# cannot buy influence: they have no weight to scale. (tests check this against the strategies)
SAMPLE_WEIGHTED = frozenset({"fedavg", "fedprox", "fedadam", "diloco"})
# strategies that look at single updates, which a zone's partial sum hides (trainer.zones)
ZONE_INCOMPATIBLE = frozenset({"trimmed_mean", "median", "krum"})


class AggregationSpec(_Strict):
    strategy: Literal[
        "fedavg", "fedprox", "fedadam", "diloco", "trimmed_mean", "median", "krum"
    ] = "fedavg"
    server_lr: Annotated[float, Field(gt=0.0, le=100.0)] = 1.0
    mu: Annotated[float, Field(ge=0.0)] = 0.01
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    beta1: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    beta2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.99
    tau: Annotated[float, Field(gt=0.0)] = 1e-3
    trim_fraction: Annotated[float, Field(ge=0.0, lt=0.5)] = 0.2
    byzantine: Annotated[int, Field(ge=0)] = 2
    krum_select: Annotated[int, Field(ge=1)] | None = None
    max_update_norm: Annotated[float, Field(gt=0.0)] = 1e4
    # "health": each update weighs num_samples x its node's health score (trainer.adapt.health)
    weighting: Literal["samples", "health"] = "samples"

    @field_validator("weighting")
    @classmethod
    def _weighting_needs_weights(cls, value: str, info: ValidationInfo) -> str:
        # a field validator (not a model one) so that the problem names aggregation.weighting;
        # strategy is declared first, so it is in info.data once it validated
        strategy = info.data.get("strategy")
        if value != "samples" and strategy is not None and strategy not in SAMPLE_WEIGHTED:
            allowed = ", ".join(sorted(SAMPLE_WEIGHTED))
            raise ValueError(
                f"{strategy} does not weight updates, so it cannot weight them by {value}; "
                f"use one of {allowed}, or weighting: samples"
            )
        return value

    # "zones": a platform node per zone pre-aggregates its zone's updates (trainer.zones);
    # the coordinator receives one partial sum per zone instead of one update per node
    hierarchy: Literal["flat", "zones"] = "flat"

    @field_validator("hierarchy")
    @classmethod
    def _zones_need_linear_rules(cls, value: str, info: ValidationInfo) -> str:
        if value != "zones":
            return value
        strategy = info.data.get("strategy")
        if strategy in ZONE_INCOMPATIBLE:
            allowed = ", ".join(sorted(SAMPLE_WEIGHTED))
            raise ValueError(
                f"{strategy} looks at each update on its own, which a zone's pre-aggregated "
                f"sum hides; use hierarchy: flat, or one of {allowed}"
            )
        if info.data.get("weighting") == "health":
            raise ValueError(
                "weighting: health needs each node's score at the coordinator, which a "
                "zone's pre-aggregated sum hides; use weighting: samples or hierarchy: flat"
            )
        return value


class ShardingSpec(_Strict):
    method: Literal["random", "stratified", "capability", "length", "prepartitioned"] = "stratified"
    num_shards: Annotated[int, Field(ge=1, le=100_000)] | None = None
    # Re-cut the training split at round boundaries into one shard per node online to work
    # on the job, when that cohort changes (the marketplace: docs/job-spec.md). `num_shards`
    # is then round 1's count. method "capability" re-cuts whether or not this is set.
    elastic: bool = False

    @property
    def reshards(self) -> bool:
        """Whether rounds re-cut the shards: a capability split only means something once
        the nodes whose throughput sizes it are known, which is at a round's opening."""
        return self.elastic or self.method == "capability"


class CompressionSpec(_Strict):
    codec: Literal["none", "fp16", "int8", "int4", "topk", "auto"] = "none"
    topk_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 0.05
    block_size: Annotated[int, Field(ge=8, le=65536)] = 256
    # Global models to nodes: "none" downloads each round's model whole; "fp16"/"int8" send a
    # delta against the model the node already holds (trainer.delivery); "auto" picks int8
    # for network-aware jobs (adaptation.enabled) and "none" otherwise.
    download_codec: Literal["auto", "none", "fp16", "int8"] = "auto"


class AdaptationSpec(_Strict):
    """Network-aware rounds: how the adaptation policy sizes each node's work."""

    enabled: bool = False
    target_utilization: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    min_local_steps: Annotated[int, Field(ge=1)] = 1
    max_local_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 2500
    # a node whose transfers take this many times the median's syncs every other round
    far_sync_factor: Annotated[float, Field(gt=1.0)] = 3.0
    max_batch_scale: Annotated[float, Field(ge=1.0, le=64.0)] = 4.0
    deadline_slack: Annotated[float, Field(ge=0.0, le=10.0)] = 0.2
    # Keep training while the update uploads and the next model downloads, merging the new
    # global model in when it arrives (overlapped communication, as in Streaming DiLoCo).
    overlap: bool = True
    # with overlap: the share of each period trained after the merge, on the fresh model
    min_post_merge: Annotated[float, Field(gt=0.0, le=1.0)] = 0.25

    @model_validator(mode="after")
    def _steps_order(self) -> AdaptationSpec:
        if self.min_local_steps > self.max_local_steps:
            raise ValueError("min_local_steps must not exceed max_local_steps")
        return self


class SecureAggregationSpec(_Strict):
    """Secure aggregation (trainer/secagg, docs/privacy.md): the server learns the sum of
    the round's updates and none of them alone. `threshold`: the share of the round's roster
    whose shares rebuild a node's secrets (above half); up to 1 - threshold of the nodes may
    drop after sharing their keys. `clipping_range`: each coordinate is clipped to it before
    being quantized into the field. `setup_s`: how long the round waits for keys and shares
    before going on without the nodes that sent none."""

    enabled: bool = False
    threshold: Annotated[float, Field(gt=0.5, le=1.0)] = 0.66
    clipping_range: Annotated[float, Field(gt=0.0, le=1e6)] = 8.0
    setup_s: Annotated[float, Field(gt=0.0, le=3600.0)] = 60.0


class PrivacySpec(_Strict):
    """Differential privacy (trainer/privacy.py, docs/privacy.md).

    `mode: update` clips each task's whole update to `clip_norm` and noises it on the node
    (user-level DP-FedAvg, the user being a shard of the data); `mode: sample` is Opacus's
    DP-SGD, each example's gradient clipped to `clip_norm` and every step noised. With a
    target `epsilon` (and `delta`) and no `noise_multiplier`, the marketplace computes the
    noise that keeps `rounds.max_rounds` rounds within it; with both, the job stops before a
    round would spend more than `epsilon`.
    """

    clip_norm: Annotated[float, Field(gt=0.0)] | None = None
    noise_multiplier: Annotated[float, Field(ge=0.0, le=1000.0)] = 0.0
    mode: Literal["update", "sample"] = "update"
    epsilon: Annotated[float, Field(gt=0.0, le=1000.0)] | None = None
    delta: Annotated[float, Field(gt=0.0, lt=1.0)] = 1e-5
    secure_aggregation: SecureAggregationSpec = SecureAggregationSpec()

    @model_validator(mode="after")
    def _noise_needs_clip(self) -> PrivacySpec:
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError("noise_multiplier needs clip_norm (noise is scaled to the clip)")
        if self.epsilon is not None and self.clip_norm is None:
            raise ValueError("epsilon needs clip_norm (the privacy bound is set by the clip)")
        if self.mode == "sample" and self.clip_norm is None:
            raise ValueError("mode 'sample' needs clip_norm (each example's gradient is clipped)")
        return self

    @property
    def private(self) -> bool:
        """Whether the job makes a differential-privacy promise (noise, or a budget)."""
        return self.noise_multiplier > 0 or self.epsilon is not None


class RequirementsSpec(_Strict):
    """What a node must have to take the job's tasks; the scheduler enforces all of it.

    `min_memory_gb` is the memory a task trains in, on whatever device the node trains on:
    a GPU's memory, or for a CPU node the RAM it gives a task (the node's `memory_gb`).
    `min_vram_gb` asks for that much GPU memory, which a CPU node never has; it implies
    `gpu_required`. `isolation: full` keeps the job's tasks on nodes whose sandbox confines
    them completely (no network, only the task's folder: bubblewrap on Linux), never on
    nodes whose sandbox only limits a task's resources (Windows job objects, a Linux node
    without bubblewrap): "limits only" in `gpuflex-node info` and on the job page.
    """

    min_memory_gb: Annotated[float, Field(ge=0.0)] = 0.0
    min_vram_gb: Annotated[float, Field(ge=0.0)] = 0.0
    min_fp32_tflops: Annotated[float, Field(ge=0.0)] = 0.0
    gpu_required: bool = False
    max_price_per_hour: Annotated[float, Field(gt=0.0)] | None = None  # 0 hires no one
    isolation: Literal["any", "full"] = "any"


class RuntimeSpec(_Strict):
    """What the node's training runtime must be (docs/runtime-packs.md): `min_torch` pins the
    oldest torch the job's code needs ("2.13", "2.13.0"); nodes whose runtime holds an older
    torch, or never said which, are not given its tasks."""

    min_torch: Annotated[str, Field(pattern=r"^\d{1,4}(\.\d{1,4}){0,2}$")] | None = None


TrackerName = Literal["mlflow", "tensorboard", "wandb"]
# what MLflow, TensorBoard and W&B all take as an experiment or project name
_EXPERIMENT = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}$"


class TrackingSpec(_Strict):
    """Experiment tracking: each round's metrics (and the final model) go to these trackers.

    Where they write is the server's choice, never a path from the spec: MLflow to
    `mlflow_uri` (http or https only) or else a `file:` store under the server's data
    directory for this job, TensorBoard event files and W&B's offline run there too.
    """

    backends: Annotated[list[TrackerName], Field(max_length=3)] = []
    mlflow_uri: Annotated[str, Field(max_length=500)] | None = None
    experiment: Annotated[str, Field(pattern=_EXPERIMENT)] | None = None

    @field_validator("backends")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each tracker once")
        return value

    @field_validator("mlflow_uri")
    @classmethod
    def _remote_http(cls, value: str | None) -> str | None:
        # a file: or database URI would make the server write where the buyer says
        if value is None:
            return value
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "an MLflow tracking server's http(s) URL; leave it out for the job's own "
                "file store on the server"
            )
        if parts.username or parts.password:
            raise ValueError("no credentials in the URL")
        return value

    @model_validator(mode="after")
    def _uri_needs_mlflow(self) -> TrackingSpec:
        if self.mlflow_uri and "mlflow" not in self.backends:
            raise ValueError("mlflow_uri is given but 'mlflow' is not among the backends")
        return self


_UUID = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"


def secagg_conflict(sections: dict[str, Any]) -> str:
    """Why the other sections of a spec cannot go with secure aggregation ("" if they can).
    `sections`: the validated sections declared before `privacy`."""
    if sections.get("kind", "train") in ("evaluate", "inference"):
        return "it sums training updates; evaluate and inference jobs send no update"
    agg: AggregationSpec | None = sections.get("aggregation")
    if agg is not None and agg.strategy in ZONE_INCOMPATIBLE:
        return (
            f"{agg.strategy} takes order statistics or distances of single updates, which "
            "the server never sees: a robust rule cannot run on a masked sum; use fedavg, "
            "fedprox, fedadam or diloco (privacy.clip_norm bounds what one node can move)"
        )
    if agg is not None and agg.weighting != "samples":
        return "weighting: health scales single updates, which the server never sees"
    if agg is not None and agg.hierarchy != "flat":
        return "hierarchy: zones has an aggregator see its zone's updates; use flat"
    comp: CompressionSpec | None = sections.get("compression")
    if comp is not None and comp.codec != "none":
        if comp.codec == "topk":
            why = ("per-node masks fill every coordinate, so a sparse update masked is dense "
                   "(no saving) and each node's kept indices would differ")  # fmt: skip
        else:
            why = ("the update is quantized into the field anyway (4 bytes a weight, as "
                   "float32); a codec's own rounding would only add error")  # fmt: skip
        return f"compression.codec {comp.codec!r}: {why}; use codec: none"
    adapt: AdaptationSpec | None = sections.get("adaptation")
    if adapt is not None and adapt.enabled:
        return ("adaptation.enabled gives far nodes two-round tasks folded into a later round "
                "one by one, outside that round's masked sum")  # fmt: skip
    rounds: RoundsSpec | None = sections.get("rounds")
    if rounds is not None and rounds.late_updates != "drop":
        return "rounds.late_updates: stale folds single late updates in; use drop"
    return ""


class SourceSpec(_Strict):
    """Where a scoring job's (evaluate, inference) model comes from: a finished training
    job of the same buyer, whose final model and model section it takes."""

    job: Annotated[str, Field(pattern=_UUID)]


# "train": federated training rounds; "evaluate": score a finished model on a dataset (loss,
# accuracy), "inference": its predictions for every row (trainer.scoring); "sweep": a
# hyperparameter search whose trials are training jobs (trainer.sweep)
JobKind = Literal["train", "evaluate", "inference", "sweep"]


class JobSpec(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    kind: JobKind = "train"
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    # scoring jobs: the model is a finished job's (`source.job`) or the uploaded
    # `model.checkpoint`, exactly one of the two
    source: SourceSpec | None = None
    dataset: DatasetSpec = DatasetSpec()
    model: ModelSpec = ModelSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    local: LocalSpec = LocalSpec(epochs=1)
    rounds: RoundsSpec = RoundsSpec()
    aggregation: AggregationSpec = AggregationSpec()
    sharding: ShardingSpec = ShardingSpec()
    compression: CompressionSpec = CompressionSpec()
    adaptation: AdaptationSpec = AdaptationSpec()
    privacy: PrivacySpec = PrivacySpec()
    requirements: RequirementsSpec = RequirementsSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    tracking: TrackingSpec = TrackingSpec()
    # kind: sweep only: the search; the sections above are each trial's base spec
    sweep: SweepSpec | None = None

    @property
    def needs_gpu_runtime(self) -> bool:
        """bf16 and fp16 are GPU mixed precision here (LocalSpec.precision): a node whose
        runtime is the cpu one (desktop/runtime) cannot run them."""
        return self.local.precision in ("bf16", "fp16")

    @model_validator(mode="before")
    @classmethod
    def _naive_rounds(cls, data: Any) -> Any:
        """`rounds.mode: naive` is one local step per round, every node, no compression: the
        settings that make it so are filled in, and ones that contradict it are refused."""
        if not isinstance(data, dict):
            return data
        rounds = data.get("rounds")
        if not isinstance(rounds, dict) or rounds.get("mode") != "naive":
            return data
        wants = {  # section -> key -> (the value naive mode needs, what else it may be given)
            "local": {"steps": (1, {1}), "epochs": (None, {None})},
            "rounds": {"quorum": (1.0, {1.0}), "late_updates": ("drop", {"drop"})},
            "compression": {
                "codec": ("none", {"none"}),
                "download_codec": ("none", {"none", "auto"}),
            },
            "adaptation": {"enabled": (False, {False})},
        }
        out = dict(data)
        for section, keys in wants.items():
            given = out.get(section) or {}
            if not isinstance(given, dict):
                return data  # the section's own validation says what is wrong
            fixed = dict(given)
            for key, (value, allowed) in keys.items():
                if key in given and given[key] not in allowed:
                    raise ValueError(
                        f"rounds.mode naive trains one local step per round on every node, "
                        f"uncompressed: {section}.{key} {given[key]!r} contradicts it (leave it "
                        "out)"
                    )
                if value is None:
                    fixed.pop(key, None)
                else:
                    fixed[key] = value
            out[section] = fixed
        return out

    @model_validator(mode="after")
    def _sweep_section(self) -> JobSpec:
        if (self.kind == "sweep") != (self.sweep is not None):
            raise ValueError("a 'sweep' section goes with kind: sweep, and only with it")
        if self.sweep is None:
            return self
        if self.sweep.objective == "rounds_to_target" and (
            self.sweep.target is None and self.rounds.target is None
        ):
            raise ValueError(
                "objective rounds_to_target needs a target: sweep.target or rounds.target"
            )
        return self

    @field_validator("privacy")
    @classmethod
    def _secagg_combinations(cls, value: PrivacySpec, info: ValidationInfo) -> PrivacySpec:
        """Secure aggregation hides each update: what needs one update on its own cannot
        work with it (docs/privacy.md, "What combines with secure aggregation")."""
        if value.secure_aggregation.enabled and (problem := secagg_conflict(info.data)):
            raise ValueError(f"secure_aggregation: {problem}")
        return value

    @model_validator(mode="after")
    def _program_privacy(self) -> JobSpec:
        if self.model.arch == "exported" and self.privacy.mode == "sample":
            raise ValueError(
                "privacy.mode 'sample' (per-example gradients) needs a zoo model; an exported "
                "program computes its batch's loss in one piece: use mode 'update'"
            )
        return self

    @model_validator(mode="after")
    def _scoring_model(self) -> JobSpec:
        if self.kind in ("train", "sweep"):
            if self.source is not None:
                raise ValueError("'source' is for evaluate and inference jobs")
        elif (self.source is None) == (self.model.checkpoint is None):
            raise ValueError(
                f"a {self.kind} job scores a finished model: give 'source: {{job: ID}}' (a "
                "finished job of yours) or 'model.checkpoint' (an uploaded safetensors file), "
                "one of the two"
            )
        return self

    @property
    def scoring(self) -> bool:
        """An evaluate or inference job: one pass of a finished model over the dataset."""
        return self.kind in ("evaluate", "inference")

    def trial_base(self) -> dict[str, Any]:
        """A sweep's trials' spec before their parameters: this spec as a training job. With
        objective rounds_to_target, trials stop at the target (no round is paid past it)."""
        data = self.to_dict()
        data.pop("sweep", None)
        data["kind"] = "train"
        sweep = self.sweep
        if sweep is not None and sweep.objective == "rounds_to_target" and sweep.target:
            data["rounds"]["target"] = {"metric": "accuracy", "value": sweep.target}
        return data

    def to_dict(self) -> dict[str, Any]:
        # a spec without a sweep stores no `sweep: null` (specs stored before sweeps existed)
        # nor `model.program: null` (every spec that is not an exported program's)
        exclude: dict[str, Any] = {}
        if self.sweep is None:
            exclude["sweep"] = True
        if self.model.program is None:
            exclude["model"] = {"program"}
        return self.model_dump(mode="json", exclude=exclude or None)

    def replace(self, **changes: Any) -> JobSpec:
        """A copy with top-level sections replaced, re-validated."""
        data = self.to_dict()
        for key, value in changes.items():
            data[key] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        return parse_spec(data)


def _field_path(loc: tuple[Any, ...]) -> str:
    # pydantic puts the validator name in loc for union members; keep only real field names
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or "-" in p))]
    return ".".join(parts) or "<root>"


def parse_spec(data: Any, source: str = "spec") -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError([("<root>", "a job spec is a mapping of sections")], source)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            reason = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                reason = "unknown key"
            problems.append((_field_path(err["loc"]), reason))
        raise SpecError(problems, source) from None
    if spec.sweep is not None:
        _check_corners(spec, source)
    return spec


def _check_corners(spec: JobSpec, source: str) -> None:
    """Every corner of a sweep's space must give a valid trial spec; a bad one is named by
    its parameter, before any trial runs."""
    assert spec.sweep is not None
    for name, params in corner_params(spec.sweep.space):
        try:
            parse_spec(apply_params(spec.trial_base(), params))
        except SpecError as exc:
            field, reason = exc.problems[0]
            shown = f"{name}={params[name]}"
            raise SpecError(
                [(f"sweep.space.{name}", f"the trial with {shown} is invalid: {field}: {reason}")],
                source,
            ) from None


def load_spec(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([("<file>", f"cannot read {path}: {exc.strerror}")], str(path)) from None
    try:
        data = loads_json(text) if path.suffix == ".json" else loads_yaml(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError([("<file>", f"not valid YAML/JSON: {exc}")], str(path)) from None
    except TooDeep as exc:
        raise SpecError([("<file>", str(exc))], str(path)) from None
    return parse_spec(data, str(path))
