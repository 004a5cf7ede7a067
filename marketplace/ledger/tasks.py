"""Celery tasks for the chain: thin wrappers, scheduled by beat when the chain is enabled."""

from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True, name="marketplace.ledger.tasks.settle_chain")
def settle_chain() -> dict[str, object]:
    """Credit new deposits, then settle requested payouts in one batch."""
    from marketplace.ledger.chain import chain_client, settle_payouts, sync_deposits

    client = chain_client()
    if client is None:
        return {"enabled": False}
    credited = sync_deposits(client)
    record = settle_payouts(client)
    return {
        "enabled": True,
        "deposits": credited,
        "batch": record.batch_id if record else None,
        "failed": record.failed if record else "",
    }
