"""Provenance anchors: a round's record hash written to the ProvenanceRegistry exactly once.

The round that completes a job anchors its record, the head of the job's provenance chain
(whose prev_hash links commit to every earlier record); with the spec's
`rounds.anchor_rounds` every round's record is anchored as the round closes. The row is
stored in the transaction that closes the round and sent after it commits (a task, and the
periodic settle_chain sweep for any the task missed), through `chain_once.send_once`: nothing
is anchored twice, nothing is lost across a restart. Import only with the chain enabled for
`send_anchor`; `request_anchor` is safe either way.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.ledger.models import ProvenanceAnchor

log = logging.getLogger(__name__)


def chain_enabled() -> bool:
    return bool(settings.CHAIN["URL"])


def wants_anchor(job: Job, *, head: bool) -> bool:
    """With the chain enabled: the completed job's head, and every round when the spec asks."""
    return chain_enabled() and (head or job.parsed_spec.rounds.anchor_rounds)


def request_anchor(job: Job, number: int, record_hash: str, *, head: bool) -> ProvenanceAnchor:
    """Inside the transaction that closes round `number` (when `wants_anchor`): store its
    anchor; the caller sends it once that commits (ledger.tasks.enqueue_anchor)."""
    if len(record_hash) != 64:
        raise ValueError(f"a record hash is 64 hex digits, not {record_hash!r}")
    anchor, created = ProvenanceAnchor.objects.get_or_create(
        job=job, round=number, defaults={"record_hash": record_hash, "head": head}
    )
    if not created and anchor.record_hash != record_hash:
        # the same round closed twice with different records: a bug, never anchor either
        raise ValueError(f"job {job.pk} round {number} already has record {anchor.record_hash}")
    if head and not anchor.head:
        anchor.head = True
        anchor.save(update_fields=["head"])
    return anchor


def send_anchor(pk: int) -> ProvenanceAnchor | None:
    """Get anchor `pk` on chain exactly once (a no-op when it is, or cannot be yet)."""
    from contracts import ChainError
    from marketplace.ledger.chain import chain_client
    from marketplace.ledger.chain_once import send_once

    client = chain_client()
    anchor = ProvenanceAnchor.objects.filter(pk=pk).first()
    if client is None or anchor is None or anchor.anchored or anchor.failed:
        return anchor
    job_key, digest = anchor.job_id, bytes.fromhex(anchor.record_hash)

    def landed() -> bool:
        onchain = client.anchored(job_key, anchor.round)
        if onchain is None:
            return False
        if onchain.record_hash != digest:
            _fail(anchor, f"round {anchor.round} has 0x{onchain.record_hash.hex()} on chain")
        return True

    try:
        sent = send_once(
            client,
            anchor,
            "nonce",
            landed,
            lambda n: client.anchor(job_key, anchor.round, digest, n),
        )
    except ChainError as exc:
        if exc.name == "AlreadyAnchored":  # it landed after all: the next look records it
            return anchor
        _fail(anchor, str(exc))
        return anchor
    if sent == "pending" or anchor.failed:
        return anchor
    tx = client.anchor_transaction(job_key, anchor.round)
    onchain = client.anchored(job_key, anchor.round)
    anchor.anchored = True
    anchor.anchored_at = timezone.now()
    anchor.tx_hash = "0x" + tx.hex() if tx else ""
    anchor.block_number = onchain.block_number if onchain else None
    anchor.save(update_fields=["anchored", "anchored_at", "tx_hash", "block_number"])
    return anchor


def send_pending() -> int:
    """The sweep: every anchor stored and not yet on chain (a lost task, a restart)."""
    done = 0
    for pk in ProvenanceAnchor.objects.filter(anchored=False, failed="").values_list(
        "pk", flat=True
    ):
        anchor = send_anchor(pk)
        done += bool(anchor and anchor.anchored)
    return done


def _fail(anchor: ProvenanceAnchor, reason: str) -> None:
    anchor.failed = reason[:300]
    anchor.save(update_fields=["failed"])
    log.error(
        "provenance anchor of job %s round %s failed: %s", anchor.job_id, anchor.round, reason
    )
