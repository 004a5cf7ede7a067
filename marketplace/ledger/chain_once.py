"""Sending one operator transaction exactly once, across crashes, lost answers and restarts.

The operator nonce is stored before the transaction is sent, so a run that lost the answer
can tell after a restart what became of it: on chain (done), still pending (leave it: the next
run looks again), or never arrived (send it again with the same nonce, so at most one of the
two can run). Posting afresh while the first transaction could still be mined was how a lost
receipt once paid twice. Settlement batches, their contribution roots and provenance anchors
all go through `send_once`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

from django.db import models, transaction

from contracts import ChainClient

T = TypeVar("T")
Sent = Literal["landed", "pending"]


def send_once(
    client: ChainClient,
    row: models.Model,
    nonce_field: str,
    landed: Callable[[], bool],
    send: Callable[[int], T],
) -> T | Sent:
    """``landed()`` says whether the chain already holds what ``send(nonce)`` would put there.
    Returns "landed" (nothing sent), "pending" (an earlier send may still be mined: nothing
    sent) or what ``send`` returned. A revert raises ``ChainError``; the nonce stays stored
    (spent by the reverted transaction, it reads as mined next time and is replaced)."""
    if landed():
        return "landed"
    with transaction.atomic():
        # one sender at a time picks the nonce: a second finds it stored and waits for it
        locked = type(row).objects.select_for_update(no_key=True).get(pk=row.pk)
        nonce = getattr(locked, nonce_field)
        if nonce is not None:
            state = client.nonce_state(int(nonce))
            if state == "pending":
                return "pending"
            if state == "mined":
                if landed():  # it landed between the two looks
                    return "landed"
                # the nonce is spent and the chain lacks it: that transaction reverted or
                # carried something else, and can never land now; sending afresh is safe
                nonce = None
        if nonce is None:
            nonce = client.next_nonce()
            setattr(locked, nonce_field, nonce)
            locked.save(update_fields=[nonce_field])
    setattr(row, nonce_field, nonce)
    return send(int(nonce))
