"""What a simulated run reports: per-round logs and the summary the CLI prints as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RoundLog:
    round: int
    accuracy: float
    correct: int
    total: int
    loss: float
    sim_time_s: float  # simulated clock at the end of this round
    round_s: float
    compute_s: float  # simulated compute, summed over nodes
    idle_s: float  # summed over nodes: time spent waiting for the slowest
    bytes_up: int
    bytes_down: int
    participants: int
    dropped: int
    rejected: int = 0  # updates that failed validation
    stale: int = 0  # updates folded in from an earlier round
    bytes_in: int = 0  # what the coordinator received (zones: their partial sums)


@dataclass
class SimResult:
    method: str
    network: str
    nodes: int
    spec_name: str
    seed: int
    rounds: int = 0
    final_accuracy: float = 0.0
    final_correct: int = 0
    test_total: int = 0
    sim_wall_s: float = 0.0
    compute_s: float = 0.0
    idle_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    host_compute_s: float = 0.0  # real seconds this machine spent training
    target: float | None = None
    reached_target: bool = False
    # why the run ended before max_rounds without reaching its target ("" otherwise): an
    # early-stopping plateau (trainer.schedule.plateau_reason)
    stop_reason: str = ""
    time_to_target_s: float | None = None
    rounds_to_target: int | None = None
    bytes_up_to_target: int | None = None
    model_hash: str = ""
    provenance_head: str = ""
    epsilon_spent: float | None = None  # a private job's ε after its rounds (trainer.privacy)
    accuracy_per_round: list[float] = field(default_factory=list)
    sim_time_per_round: list[float] = field(default_factory=list)
    log: list[RoundLog] = field(default_factory=list)

    @property
    def utilization(self) -> float:
        """Compute time over wall time, per node: the share of the run spent training."""
        wall = self.sim_wall_s * self.nodes
        return self.compute_s / wall if wall else 0.0

    @property
    def idle_fraction(self) -> float:
        wall = self.sim_wall_s * self.nodes
        return self.idle_s / wall if wall else 0.0

    def add_round(self, log: RoundLog) -> None:
        self.log.append(log)
        self.rounds = log.round
        self.final_accuracy = log.accuracy
        self.final_correct = log.correct
        self.test_total = log.total
        self.sim_wall_s = log.sim_time_s
        self.compute_s += log.compute_s
        self.idle_s += log.idle_s
        self.bytes_up += log.bytes_up
        self.bytes_down += log.bytes_down
        self.accuracy_per_round.append(log.accuracy)
        self.sim_time_per_round.append(log.sim_time_s)

    def mark_target(self) -> None:
        if not self.reached_target:
            self.reached_target = True
            self.time_to_target_s = self.sim_wall_s
            self.rounds_to_target = self.rounds
            self.bytes_up_to_target = self.bytes_up

    def to_dict(self, with_log: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_log:
            data.pop("log")
        data["utilization"] = self.utilization
        data["idle_fraction"] = self.idle_fraction
        data["bytes_up_per_node"] = self.bytes_up / self.nodes
        data["bytes_up_per_node_to_target"] = (
            None if self.bytes_up_to_target is None else self.bytes_up_to_target / self.nodes
        )
        return data
