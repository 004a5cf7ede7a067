"""Round 3 of secure aggregation on the server: the survivors' revealed shares; with the
threshold's worth in, the round aggregates (marketplace/rounds/secagg.py)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from marketplace.jobs.errors import Conflict, MarketplaceError
from marketplace.nodes.models import Node
from marketplace.rounds.lifecycle import start_aggregation
from marketplace.rounds.models import Round, RoundStatus
from marketplace.rounds.secagg_models import SecAggPhase
from trainer.secagg.shamir import SHARE_BYTES


def _parsed(revealed: Any, survivors: set[int], dropped: set[int]) -> dict[str, list[str]]:
    """{node index: [kind, share hex]}: a seed share for each survivor, a key share for each
    dropped node, nothing else (the server checks what an honest node checks too)."""
    if not isinstance(revealed, dict):
        raise MarketplaceError("shares maps node indices to [kind, share].", field="shares")
    out = {}
    for key, value in revealed.items():
        try:
            u, (kind, share) = int(key), value
            valid = len(bytes.fromhex(share)) == SHARE_BYTES
        except (TypeError, ValueError):
            valid = False
        if not valid:
            raise MarketplaceError(f"shares[{key!r}] must be [kind, {SHARE_BYTES}-byte hex].",
                                   field="shares")  # fmt: skip
        expected = "b" if u in survivors else "s" if u in dropped else None
        if kind != expected:
            raise MarketplaceError(
                f"shares[{key!r}]: node {u} calls for "
                + ("no share" if expected is None else f"kind {expected!r}"), field="shares",
            )  # fmt: skip
        out[str(u)] = [kind, share]
    if set(map(int, out)) != survivors | dropped:
        raise MarketplaceError("shares must cover every node that shared its keys.",
                               field="shares")  # fmt: skip
    return out


def accept_unmask(node: Node, task_id: object, revealed: Any) -> dict[str, Any]:
    from marketplace.rounds.secagg import locked_state, member_of, round_view, secagg_task

    task = secagg_task(node, task_id)
    with transaction.atomic():
        rnd = (
            Round.objects.select_for_update(no_key=True).select_related("job").get(pk=task.round_id)
        )
        sa = locked_state(rnd)
        member = member_of(sa, task)
        if sa.phase not in (SecAggPhase.UNMASK, SecAggPhase.READY):
            raise Conflict("The round is not unmasking.", phase=sa.phase)
        if member is None or member.index not in sa.survivors:
            raise Conflict("Only the round's survivors reveal shares.")
        if member.answered:
            return round_view(sa, member)  # a retry
        member.revealed = _parsed(revealed, set(sa.survivors), set(sa.dropped))
        member.answered = True
        member.save(update_fields=["revealed", "answered"])
        answered = sa.members.filter(answered=True).count()
        if sa.phase == SecAggPhase.UNMASK and answered >= sa.threshold:
            sa.phase = SecAggPhase.READY
            sa.save(update_fields=["phase"])
            if rnd.status == RoundStatus.OPEN:
                start_aggregation(rnd)
        return round_view(sa, member)
