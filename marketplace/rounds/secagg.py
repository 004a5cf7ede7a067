"""Secure aggregation on the server (trainer/secagg, docs/privacy.md): the phases of a round
whose job sets `privacy.secure_aggregation.enabled`, driven by the nodes' requests.

The marketplace is pull-based, so each request moves the round on when it can (`_advance`):
the roster is fixed once every task of the round has advertised its keys, or at the setup
deadline with at least MIN_NODES; the sharing set U1 once every member has sent its sealed
shares, or at the next deadline with at least the threshold. Masked inputs arrive through
the ordinary update upload (uploads.accept_update), as TaskResults. When the round would
start aggregating (quorum, or its deadline), `hold_for_unmask` fixes the survivors U2 and asks
them for shares instead; once the threshold's worth answered (secagg_replies.py), the round
aggregates, and `secagg_contribution` removes the masks: the one update the strategy sees is
the survivors' mean. No plain individual update ever reaches the server, its files or its log.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import numpy as np
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, NotFound, UpdateRejectedError
from marketplace.jobs.models import Job
from marketplace.jobs.models_io import load_model_file
from marketplace.nodes.models import Node
from marketplace.rounds.models import Round, RoundStatus, Task, TaskResult, TaskStatus
from marketplace.rounds.secagg_models import SecAggMember, SecAggPhase, SecAggRound, SecAggShare
from trainer import round_lifecycle as rl
from trainer.aggregation import ClientUpdate
from trainer.hashing import bytes_hash
from trainer.lora import update_part
from trainer.secagg import field as gf
from trainer.secagg.protocol import MIN_NODES, Roster, threshold_for, unmask_sum
from trainer.secagg.vectors import decode_masked, layout, unflatten

HEX_KEY = re.compile(r"^[0-9a-f]{64}$")
MAX_SEALED_BYTES = 512  # two 66-byte shares, a nonce and a tag: well under
ORDER = [SecAggPhase.ADVERTISE, SecAggPhase.SHARE, SecAggPhase.MASK, SecAggPhase.UNMASK,
         SecAggPhase.READY]  # fmt: skip


def secure(job: Job) -> bool:
    return job.parsed_spec.privacy.secure_aggregation.enabled


def context(rnd: Round) -> bytes:
    """What binds every key, mask and share to this round of this job."""
    return f"gpuflex-secagg|{rnd.job_id}|{rnd.number}".encode()


def secagg_task(node: Node, task_id: object) -> Task:
    try:
        task = Task.objects.select_related("round__job").get(pk=task_id, node=node)
    except (Task.DoesNotExist, ValueError, TypeError, ValidationError):
        raise NotFound("No such task is leased to this node.") from None
    if not secure(task.round.job):
        raise MarketplaceError("This task's job does not use secure aggregation.")
    return task


def locked_state(rnd: Round) -> SecAggRound:
    """The round's secure-aggregation state, row-locked (created at the first request)."""
    setup = timedelta(seconds=rnd.job.parsed_spec.privacy.secure_aggregation.setup_s)
    SecAggRound.objects.get_or_create(
        round=rnd, defaults={"phase_deadline": timezone.now() + setup}
    )
    return SecAggRound.objects.select_for_update(no_key=True).get(round=rnd)


def member_of(sa: SecAggRound, task: Task) -> SecAggMember | None:
    return SecAggMember.objects.filter(secagg=sa, task=task).first()


def _past(sa: SecAggRound, phase: str) -> bool:
    return ORDER.index(SecAggPhase(sa.phase)) >= ORDER.index(SecAggPhase(phase))


def _advance(sa: SecAggRound, rnd: Round) -> None:
    """Move the round on as far as its members' messages and deadlines allow."""
    now = timezone.now()
    spec = rnd.job.parsed_spec.privacy.secure_aggregation
    if sa.phase == SecAggPhase.ADVERTISE:
        members = list(sa.members.order_by("pk"))
        # every task that may still join (leased, or waiting for its node) has, or time is up
        open_tasks = Task.objects.filter(
            round=rnd, status__in=[TaskStatus.PENDING, TaskStatus.LEASED, TaskStatus.DONE]
        ).count()
        if len(members) >= MIN_NODES and (len(members) >= open_tasks or now >= sa.phase_deadline):
            for i, m in enumerate(members, start=1):
                m.index = i
                m.save(update_fields=["index"])
            sa.threshold = threshold_for(len(members), spec.threshold)
            sa.phase = SecAggPhase.SHARE
            sa.phase_deadline = now + timedelta(seconds=spec.setup_s)
    if sa.phase == SecAggPhase.SHARE:
        roster = sa.members.filter(index__isnull=False).count()
        sent = sorted(set(sa.shares.values_list("sender", flat=True)))
        if len(sent) == roster or (now >= sa.phase_deadline and len(sent) >= sa.threshold):
            sa.shared, sa.phase = sent, SecAggPhase.MASK
    sa.save()


def round_view(sa: SecAggRound, member: SecAggMember | None) -> dict[str, Any]:
    """What a member may know of the round: its phase and, as they are fixed, the roster,
    U1, and the survivors and dropped nodes."""
    view: dict[str, Any] = {"phase": sa.phase, "index": member.index if member else None}
    if _past(sa, SecAggPhase.SHARE):
        members = sa.members.filter(index__isnull=False).order_by("index")
        view |= {
            "threshold": sa.threshold,
            "context": context(sa.round).hex(),
            "members": [{"index": m.index, "c_key": m.c_key, "s_key": m.s_key} for m in members],
        }
    if _past(sa, SecAggPhase.MASK):
        view["shared"] = sa.shared
    if _past(sa, SecAggPhase.UNMASK):
        view |= {"survivors": sa.survivors, "dropped": sa.dropped}
    return view


def advertise(node: Node, task_id: object, c_key: str, s_key: str) -> dict[str, Any]:
    """Round 0: the node's two public keys (hex), once per task."""
    task = secagg_task(node, task_id)
    for name, key in (("c_key", c_key), ("s_key", s_key)):
        if not isinstance(key, str) or not HEX_KEY.match(key):
            raise MarketplaceError(
                f"{name} must be a 32-byte X25519 public key in hex.", field=name
            )
    if c_key == s_key:
        raise MarketplaceError("c_key and s_key must be two different keys.", field="s_key")
    with transaction.atomic():
        if task.status != TaskStatus.LEASED or task.round.status != RoundStatus.OPEN:
            raise Conflict(f"The task is {task.status}; it no longer takes part in its round.")
        sa = locked_state(task.round)
        member = member_of(sa, task)
        if member is not None and (member.c_key, member.s_key) != (c_key, s_key):
            raise Conflict("This task advertised other keys already.")
        if member is None:
            if sa.phase != SecAggPhase.ADVERTISE:
                raise Conflict("The round's roster was fixed without this node.")
            member = SecAggMember.objects.create(secagg=sa, task=task, c_key=c_key, s_key=s_key)
        _advance(sa, task.round)
        return round_view(sa, member)


def status(node: Node, task_id: object) -> dict[str, Any]:
    """The round as this task's node sees it now (and moved on if a deadline passed)."""
    task = secagg_task(node, task_id)
    with transaction.atomic():
        sa = locked_state(task.round)
        _advance(sa, task.round)
        return round_view(sa, member_of(sa, task))


def post_shares(node: Node, task_id: object, sealed: dict[str, str]) -> dict[str, Any]:
    """Round 1: recipient index -> that recipient's sealed shares (hex), one per other
    member of the roster. The server cannot open them (AES-GCM under a key of the pair)."""
    task = secagg_task(node, task_id)
    with transaction.atomic():
        sa = locked_state(task.round)
        member = member_of(sa, task)
        if member is None or member.index is None:
            raise Conflict("This node is not in the round's roster.")
        if sa.shares.filter(sender=member.index).exists():
            return round_view(sa, member)  # a retry: the first shares stand
        if sa.phase != SecAggPhase.SHARE:
            raise Conflict("The round went on without this node's shares.")
        others = set(sa.members.filter(index__isnull=False).values_list("index", flat=True))
        others.discard(member.index)
        try:
            parsed = {int(k): bytes.fromhex(v) for k, v in sealed.items()}
        except (TypeError, ValueError, AttributeError):
            raise MarketplaceError("shares maps recipient indices to hex ciphertexts.",
                                   field="shares") from None  # fmt: skip
        if set(parsed) != others:
            raise MarketplaceError("shares must hold one entry for every other member of the "
                                   "roster, and no other.", field="shares")  # fmt: skip
        if any(not 0 < len(v) <= MAX_SEALED_BYTES for v in parsed.values()):
            raise MarketplaceError(f"a sealed share is 1 to {MAX_SEALED_BYTES} bytes.",
                                   field="shares")  # fmt: skip
        SecAggShare.objects.bulk_create(
            SecAggShare(secagg=sa, sender=member.index, recipient=v, sealed=c)
            for v, c in parsed.items()
        )
        _advance(sa, task.round)
        return round_view(sa, member)


def incoming(node: Node, task_id: object) -> dict[str, str]:
    """Round 1's answer, once U1 is fixed: sender index -> its shares sealed for this node."""
    task = secagg_task(node, task_id)
    with transaction.atomic():
        sa = locked_state(task.round)
        _advance(sa, task.round)
        member = member_of(sa, task)
        if not _past(sa, SecAggPhase.MASK):
            raise Conflict("The round's sharing set is not fixed yet.", phase=sa.phase)
        if member is None or member.index not in sa.shared:
            raise Conflict("The round went on without this node's shares.")
        rows = sa.shares.filter(recipient=member.index, sender__in=sa.shared)
        return {str(s.sender): bytes(s.sealed).hex() for s in rows}


def _length(rnd: Round) -> tuple[int, list[tuple[str, list[int]]]]:
    spec = rnd.job.parsed_spec
    shapes = layout(update_part(spec.model, load_model_file(rnd.input_model_file)))
    return sum(int(np.prod(s)) if s else 1 for _, s in shapes), shapes


def _metadata(body: bytes) -> dict[str, str]:
    """A safetensors file's metadata (its JSON header, bounded by the body's length)."""
    if len(body) < 8:
        return {}
    n = int.from_bytes(body[:8], "little")
    try:
        header = json.loads(body[8 : 8 + n]) if n <= min(len(body) - 8, 1 << 16) else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def check_masked(task: Task, body: bytes) -> dict[str, str]:
    """Round 2: a masked input may be taken (its node is in U1, the round is masking) and is
    field elements of the model's update size. Returns its metadata."""
    with transaction.atomic():
        sa = locked_state(task.round)
        _advance(sa, task.round)
        member = member_of(sa, task)
        if member is None or member.index not in sa.shared:
            raise Conflict("This job uses secure aggregation and this node did not share its "
                           "keys in this round: no update is taken from it.")  # fmt: skip
        if sa.phase != SecAggPhase.MASK:
            raise Conflict("The round's masked inputs are fixed; this one came too late.")
    length, _ = _length(task.round)
    try:
        decode_masked(body, length)
    except ValueError as exc:
        raise UpdateRejectedError(
            f"The update was rejected: this job uses secure aggregation and takes masked "
            f"updates only; {exc}.", reason="secagg",
        ) from None  # fmt: skip
    return _metadata(body)


def hold_for_unmask(rnd: Round) -> bool:
    """Called where the round would start aggregating (the caller holds the round's lock):
    True while its masks are still on. The first call fixes the survivors (the U1 members
    whose masked input is in) and asks them for shares."""
    if not secure(rnd.job):
        return False
    sa = locked_state(rnd)
    if sa.phase == SecAggPhase.READY:
        return False
    if sa.phase == SecAggPhase.MASK:
        members = {m.task_id: m.index for m in sa.members.filter(index__in=sa.shared)}
        uploaded = TaskResult.objects.filter(task_id__in=list(members), accepted=True)
        survivors = sorted(members[t] for t in uploaded.values_list("task_id", flat=True))
        if rl.secure_hold(len(survivors), sa.threshold):
            return True  # too few to unmask (it would expose them): wait for more uploads
        sa.survivors = survivors
        sa.dropped = sorted(set(sa.shared) - set(survivors))
        sa.phase = SecAggPhase.UNMASK
        setup = rnd.job.parsed_spec.privacy.secure_aggregation.setup_s
        sa.phase_deadline = timezone.now() + timedelta(seconds=setup)
        sa.save(update_fields=["survivors", "dropped", "phase", "phase_deadline"])
        job_changed(rnd.job_id)
    return True


def stall_reason(rnd: Round) -> str:
    """Why a secure round past its deadline can never be unmasked ("" while it still can):
    fewer than MIN_NODES sent keys, fewer nodes uploaded (or may still) than the threshold,
    or the survivors' shares did not come within `setup_s` of the request. Unmasking fewer
    would expose them, so the job ends."""
    sa = SecAggRound.objects.filter(round=rnd).first()
    if sa is None or sa.phase in (SecAggPhase.SHARE, SecAggPhase.READY):
        return ""
    if sa.phase == SecAggPhase.ADVERTISE:
        members = sa.members.count()
        if timezone.now() < sa.phase_deadline or members >= MIN_NODES:
            return ""
        return (f"Secure aggregation needs at least {MIN_NODES} nodes in a round; {members} "
                "sent their keys by the round's deadline.")  # fmt: skip
    if sa.phase == SecAggPhase.MASK:
        tasks = sa.members.filter(index__in=sa.shared).values_list("task_id", flat=True)
        alive = Task.objects.filter(
            pk__in=list(tasks), status__in=[TaskStatus.LEASED, TaskStatus.DONE]
        ).count()
        if alive >= sa.threshold:
            return ""
        return (f"Secure aggregation: only {alive} of the round's {len(sa.shared)} nodes "
                f"uploaded or may still upload their masked updates; {sa.threshold} are needed "
                "to unmask a sum without exposing anyone's update.")  # fmt: skip
    answered = sa.members.filter(answered=True).count()
    if timezone.now() < sa.phase_deadline or answered >= sa.threshold:
        return ""
    return (f"Secure aggregation: {answered} of the round's survivors sent their unmasking "
            f"shares in time; {sa.threshold} are needed to recover the sum.")  # fmt: skip


def secagg_contribution(job: Job, rnd: Round, results: list[TaskResult]) -> ClientUpdate:
    """The round's one update: the survivors' masked inputs summed and unmasked, divided by
    their count. Each node counts once (the server cannot weight what it cannot see)."""
    sa = SecAggRound.objects.get(round=rnd)
    members = {m.index: m for m in sa.members.filter(index__isnull=False)}
    by_task = {m.task_id: i for i, m in members.items()}
    length, shapes = _length(rnd)
    masked, samples = {}, 0
    for r in results:
        index = by_task.get(r.task_id)
        if index in sa.survivors:
            masked[index] = decode_masked(files.get(r.update_file), length)
            samples += r.num_samples
    if set(masked) != set(sa.survivors):
        raise ValueError("a survivor's masked input is missing; the sum cannot be unmasked")
    roster = Roster(
        context(rnd), sa.threshold,
        {i: bytes.fromhex(m.c_key) for i, m in members.items()},
        {i: bytes.fromhex(m.s_key) for i, m in members.items()},
    )  # fmt: skip
    replies = {
        i: {int(u): (kind, int(share, 16)) for u, (kind, share) in m.revealed.items()}
        for i, m in members.items() if m.answered
    }  # fmt: skip
    total = unmask_sum(roster, masked, sa.dropped, replies)
    clip = job.parsed_spec.privacy.secure_aggregation.clipping_range
    mean = gf.dequantize_sum(total, len(members), clip) / len(masked)
    return ClientUpdate(f"secagg:{len(masked)}", unflatten(mean, shapes), samples)


def secagg_label(job: Job, results: list[TaskResult]) -> str:
    """Provenance's shard label for the masked sum: the members' silos (or shards)."""
    labels = sorted(
        r.task.shard.content_hash if r.task.shard else f"local:{job.federated_dataset}:{r.node_id}"
        for r in results
    )
    return bytes_hash("\n".join(labels).encode())
