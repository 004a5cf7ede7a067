"""Celery tasks for the chain: thin wrappers, scheduled by beat when the chain is enabled."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from marketplace.ledger.models import NodeRegistration, ProvenanceAnchor

log = logging.getLogger(__name__)


@shared_task(acks_late=True, name="marketplace.ledger.tasks.settle_chain")
def settle_chain() -> dict[str, object]:
    """Credit new deposits, send stored anchors, and close a settlement batch when one is due
    (CHAIN BATCH_MAX contributions waiting, or the oldest waiting DEADLINE_S)."""
    from marketplace.ledger import registry
    from marketplace.ledger.anchoring import send_pending
    from marketplace.ledger.chain import chain_client, settle, sync_deposits

    client = chain_client()
    if client is None:
        return {"enabled": False}
    credited = sync_deposits(client)
    anchored = send_pending()
    registered = registry.send_pending()
    record = settle(client)
    return {
        "enabled": True,
        "deposits": credited,
        "anchors": anchored,
        "registrations": registered,
        "batch": record.batch_id if record else None,
        "failed": record.failed if record else "",
    }


@shared_task(acks_late=True, name="marketplace.ledger.tasks.anchor_provenance")
def anchor_provenance(anchor_id: int) -> bool:
    """Send one stored provenance anchor (ledger/anchoring.py)."""
    from marketplace.ledger.anchoring import send_anchor

    anchor = send_anchor(anchor_id)
    return bool(anchor and anchor.anchored)


@shared_task(acks_late=True, name="marketplace.ledger.tasks.register_node")
def register_node(registration_id: int) -> bool:
    """Send one stored NodeRegistry registration (ledger/registry.py)."""
    from marketplace.ledger.registry import send_registration

    reg = send_registration(registration_id)
    return bool(reg and reg.registered)


def enqueue_anchor(anchor: ProvenanceAnchor | None) -> None:
    """Send a stored provenance anchor once the surrounding transaction commits; if the broker
    cannot take it, the settle_chain sweep sends it (nothing is lost, nothing sent twice)."""
    if anchor is not None and not anchor.anchored:
        pk = anchor.pk
        transaction.on_commit(lambda: _delay(anchor_provenance, pk))


def enqueue_registration(registration: NodeRegistration | None) -> None:
    """As enqueue_anchor, for a NodeRegistry registration."""
    if registration is not None and not registration.registered:
        pk = registration.pk
        transaction.on_commit(lambda: _delay(register_node, pk))


def _delay(task: object, pk: int) -> None:
    try:
        task.delay(pk)  # type: ignore[attr-defined]
    except Exception:  # the broker is down: the periodic sweep sends it
        log.exception("could not enqueue %s(%s); the settle_chain sweep will", task, pk)
