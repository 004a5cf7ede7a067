"""Getting a round's model to a node: built from the seed, a delta chain against the version
the node holds, or the whole model (trainer.delivery has the arithmetic).

The server tracks what each node holds (ModelCopy: the last model it fetched or trained on,
ShardCopy: the shards it fetched). A task's `model_source` tells the agent which way to take;
the agent falls back to the whole model whenever it lacks what the source assumes, and the
sandboxed runner checks the result against the round's model hash whichever way it came.
"""

from __future__ import annotations

from typing import Any

from marketplace.jobs import files
from marketplace.jobs.errors import MarketplaceError
from marketplace.jobs.models import Job, Shard
from marketplace.nodes.models import Node
from marketplace.rounds.models import ModelCopy, Round, ShardCopy, Task

# deltas longer than this are not worth the round trips: the node fetches the whole model
MAX_CHAIN = 8


def model_source(task: Task) -> dict[str, Any]:
    """How the task's node gets the round's model (docs/agent-api.md, "Model delivery")."""
    from trainer.delivery_codec import delivery_codec_name

    rnd, job = task.round, task.round.job
    if delivery_codec_name(job.parsed_spec) == "none" or job.parsed_spec.scoring:
        return {"kind": "full"}  # a scoring job's model is never the seed's
    held = ModelCopy.objects.filter(node=task.node_id, job=job).first()
    if held is not None and held.model_hash != rnd.input_model_hash:
        chain = delta_chain(rnd, held.model_hash)
        full = files.size(rnd.input_model_file)
        if chain and sum(r.input_delta_size for r in chain) < full:
            return {"kind": "delta", "base": held.model_hash,
                    "chain": [r.input_model_hash for r in chain]}  # fmt: skip
    model = job.parsed_spec.model
    if rnd.number == 1 and model.checkpoint is None and model.program is None:
        # round 1's model is build_model(spec, seed): the node builds it and checks the hash;
        # one from the buyer's checkpoint (which nodes never get on its own) or program
        # (whose weights are the buyer's) comes whole
        return {"kind": "seed", "input_shape": list(job.input_shape),
                "num_classes": job.num_classes}  # fmt: skip
    return {"kind": "full"}


def delta_chain(rnd: Round, base_hash: str) -> list[Round] | None:
    """The rounds whose deltas lead from the model `base_hash` to `rnd`'s, oldest first;
    None when no unbroken chain of at most MAX_CHAIN deltas does."""
    rounds = list(
        Round.objects.filter(
            job=rnd.job_id, number__lte=rnd.number, number__gt=rnd.number - MAX_CHAIN
        )
        .order_by("-number")
        .only("number", "input_model_hash", "input_delta_base", "input_delta_size",
              "input_delta_file")
    )  # fmt: skip
    chain: list[Round] = []
    want = rnd.input_model_hash
    for r in rounds:  # newest first, walking back along the bases
        if r.input_model_hash != want:
            return None  # resumed from a checkpoint, or a round with no delta: no chain
        if want == base_hash:
            return chain[::-1] or None
        if r.input_delta_file:
            chain.append(r)
            want = r.input_delta_base
        # else: a round that started from the model before it unchanged (no update came)
    return None


def model_bytes(task: Task, base: str | None) -> tuple[bytes, str]:
    """The task's model, or with `base` the one delta that leads from the model `base` one
    round on towards it. Returns (bytes, hash of the model they lead to)."""
    rnd = task.round
    if not base:
        return files.get(rnd.input_model_file), rnd.input_model_hash
    chain = delta_chain(rnd, base)
    if not chain:
        raise MarketplaceError(
            f"No delta leads from model {base[:12]} to this task's model; fetch it whole "
            "(without `base`)."
        )
    step = chain[0]
    return files.get(step.input_delta_file), step.input_model_hash


def record_model(node: Node | int, job: Job | Any, rnd: Round) -> None:
    """The node now holds `rnd`'s model; an older round never overwrites a newer one."""
    node_id = getattr(node, "pk", node)
    job_id = getattr(job, "pk", job)
    updated = ModelCopy.objects.filter(
        node=node_id, job=job_id, round_number__lte=rnd.number
    ).update(round_number=rnd.number, model_hash=rnd.input_model_hash)
    if not updated:
        ModelCopy.objects.get_or_create(
            node_id=node_id, job_id=job_id,
            defaults={"round_number": rnd.number, "model_hash": rnd.input_model_hash},
        )  # fmt: skip


def record_shard(node: Node, shard: Shard) -> None:
    ShardCopy.objects.get_or_create(node=node, shard=shard)
