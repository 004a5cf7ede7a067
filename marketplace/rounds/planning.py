"""Bulk assignment of pending tasks to idle nodes, in memory.

The same rules as `scheduling.eligible_tasks` (tier, `may_work_on`, reliability, never two
replicas of one unit on one node, platform nodes take replicas first, no task in a round the
job's plan keeps the node from, no replica in a round it syncs every other round:
`scheduling.plan_rules`), applied to many
nodes at once: tasks are grouped by job, so each decision costs O(jobs), not O(tasks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

from packaging.version import InvalidVersion, Version

from marketplace.jobs.models import Tier
from marketplace.nodes.models import NodeKind


@dataclass(frozen=True)
class NodeView:
    id: int
    kind: str
    price: Decimal
    memory_gb: float  # the memory a task trains in: the GPU's, or a CPU node's task RAM
    reliability: float
    gpu: bool = False
    fp32_tflops: float = 0.0
    isolated: bool = False  # its sandbox confines a task (hardware.isolation == "full")
    gpu_runtime: bool = False  # its training runtime reaches a GPU (runtime.plan not cpu)
    torch: str = ""  # its runtime's torch version; "" never said


@dataclass(frozen=True)
class JobNeeds:
    """What a job asks of a node: its price cap and the spec's `requirements`."""

    max_price: Decimal
    min_memory_gb: float
    min_vram_gb: float = 0.0
    min_fp32_tflops: float = 0.0
    gpu_required: bool = False
    isolation_full: bool = False
    gpu_runtime: bool = False  # bf16/fp16 precision: a GPU runtime (JobSpec.needs_gpu_runtime)
    min_torch: str = ""  # the spec's runtime.min_torch


@lru_cache(maxsize=256)
def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def torch_at_least(have: str, need: str) -> bool:
    """Whether torch `have` ("2.13.0+cu128") is at least `need` ("2.13"); unknown is not."""
    got, floor = _version(have), _version(need)
    return got is not None and floor is not None and got.release >= floor.release


def may_work_on(needs: JobNeeds, node: NodeView) -> bool:
    """THE rule for whether a node's price and hardware let it take a job's tasks: the live
    claim (`scheduling.eligible_tasks`), the bulk planner (`plan_assignments`), a round's
    cohort (`scheduling.nodes_that_may_work_on`) and federated silos all ask it. Tier and
    replicas are per task, and checked beside it."""
    if node.price > needs.max_price or node.memory_gb < needs.min_memory_gb:
        return False
    if (needs.gpu_required or needs.min_vram_gb > 0) and not node.gpu:
        return False
    if node.memory_gb < needs.min_vram_gb:  # a GPU node's memory_gb is its GPU's memory
        return False
    if needs.isolation_full and not node.isolated:  # unknown (an older agent) is not full
        return False
    if needs.gpu_runtime and not node.gpu_runtime:
        return False
    if needs.min_torch and not torch_at_least(node.torch, needs.min_torch):
        return False
    return node.fp32_tflops >= needs.min_fp32_tflops


@dataclass(frozen=True)
class PlanRules:
    """What the open rounds' plans (trainer.adapt) keep one node from."""

    sat_out: Set[int] = frozenset()  # rounds it takes no task of
    # rounds whose plan has it syncing every other round: it takes no replica there, whose
    # result would come in after the round it verifies has closed
    far: Set[int] = frozenset()

    def bars(self, round_id: int, replica: int) -> bool:
        return round_id in self.sat_out or (replica > 0 and round_id in self.far)


@dataclass(frozen=True)
class TaskView:
    id: object
    job: object
    unit: tuple[int, int]  # (round id, shard id)
    replica: int
    tier: str
    needs: JobNeeds  # its job's price cap and requirements


def _eligible_job(task: TaskView, node: NodeView) -> bool:
    if not may_work_on(task.needs, node):
        return False
    if node.kind == NodeKind.PLATFORM:
        return task.tier != Tier.VOLUNTEER or task.replica > 0
    return task.tier != Tier.PLATFORM


def plan_assignments(
    tasks: Sequence[TaskView],
    nodes: Iterable[NodeView],
    *,
    slots: int = 1,
    min_reliability: float = 0.0,
    held: Iterable[tuple[tuple[int, int], int]] = (),
    rules: Mapping[int, PlanRules] | None = None,
) -> list[tuple[object, int]]:
    """(task id, node id) pairs: each node gets up to `slots` tasks, each task one node.

    `tasks` come in priority order (oldest job first); `held` lists (unit, node) pairs
    already leased, so no node is given a second replica of a unit it holds; `rules` maps a
    node to what the rounds' plans keep it from.
    """
    # per job, two queues: primaries and replicas, each in priority order
    queues: dict[object, tuple[deque[TaskView], deque[TaskView]]] = {}
    for task in tasks:
        queues.setdefault(task.job, (deque(), deque()))[task.replica > 0].append(task)
    holding = set(held)
    plan: list[tuple[object, int]] = []
    ordered = sorted(nodes, key=lambda n: n.kind != NodeKind.PLATFORM)  # platform first
    for _ in range(slots):
        for node in ordered:
            if node.reliability < min_reliability:
                continue
            task = _take(queues, node, holding, (rules or {}).get(node.id, PlanRules()))
            if task is not None:
                plan.append((task.id, node.id))
                holding.add((task.unit, node.id))
    return plan


def _take(
    queues: dict[object, tuple[deque[TaskView], deque[TaskView]]],
    node: NodeView,
    holding: set[tuple[tuple[int, int], int]],
    rules: PlanRules,
) -> TaskView | None:
    order = (1, 0) if node.kind == NodeKind.PLATFORM else (0, 1)
    for which in order:
        for pair in queues.values():
            queue = pair[which]
            # a job has one open round at a time: its queue is all of one round
            if not queue or not _eligible_job(queue[0], node):
                continue
            if rules.bars(queue[0].unit[0], queue[0].replica):
                continue
            # skip (rarely more than one) units this node already holds, keeping their order
            skipped = []
            while queue and (queue[0].unit, node.id) in holding:
                skipped.append(queue.popleft())
            task = queue.popleft() if queue else None
            queue.extendleft(reversed(skipped))
            if task is not None:
                return task
    return None
