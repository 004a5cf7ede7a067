"""What every simulated method shares: the data, its shards, the model and the virtual nodes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from trainer.datasets import Dataset, load_dataset
from trainer.models import (
    ModelInfo,
    build_model,
    checkpoint_weights,
    describe_model,
    resolve_model_files,
)
from trainer.privacy import with_budget_noise
from trainer.sharding import plan_shards
from trainer.sim.failures import Failures
from trainer.sim.network import WARM_TASKS, FixedCosts, NodeProfile, get_profile
from trainer.spec import JobSpec


@dataclass
class SimSetup:
    spec: JobSpec
    dataset: Dataset
    shards: list[Dataset]
    shard_hashes: list[str]
    model: nn.Module
    info: ModelInfo
    profiles: list[NodeProfile]
    initial_state: dict[str, torch.Tensor]
    network: str
    seed: int
    costs: FixedCosts = WARM_TASKS  # what a real task and round cost besides transfers, compute
    # exactly so many nodes fail each round, as a bench kills agents (run_federated's rounds)
    failures: Failures | None = None

    @property
    def train_flops_per_sample(self) -> int:
        return 3 * self.info.flops_per_sample  # forward + backward ~ 3x forward


def prepare(
    spec: JobSpec,
    nodes: int,
    network: str,
    seed: int,
    base_dir: Path | None = None,
    costs: FixedCosts = WARM_TASKS,
) -> SimSetup:
    if nodes < 1:
        raise ValueError("a simulation needs at least one node")
    profile = get_profile(network)
    profiles = profile.nodes(nodes, seed)
    dataset = load_dataset(spec.dataset, seed=seed, base_dir=base_dir)
    method = spec.sharding.method
    weights = [p.speed for p in profiles] if method == "capability" else None
    if method == "prepartitioned":
        raise ValueError("the simulator makes its own shards; use random, stratified or capability")
    shards = plan_shards(dataset, nodes, method=method, seed=seed, weights=weights)
    # a config.json or checkpoint named by path is read once, here, next to the spec file
    spec = spec.replace(model=resolve_model_files(spec.model, base_dir))
    # a target ε without noise: the noise the marketplace would store (trainer.privacy)
    spec = with_budget_noise(spec, min(s.size for s in shards))
    model = build_model(
        spec.model, dataset.input_shape, dataset.num_classes, seed=seed,
        weights=checkpoint_weights(spec.model),
    )  # fmt: skip
    info = describe_model(model, dataset.input_shape, dataset.task == "language_model")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return SimSetup(
        spec=spec,
        dataset=dataset,
        shards=[dataset.subset(torch.from_numpy(s.indices)) for s in shards],
        shard_hashes=[s.content_hash for s in shards],
        model=model,
        info=info,
        profiles=profiles,
        initial_state=state,
        network=network,
        seed=seed,
        costs=costs,
    )
