"""`gpuflex manage settle_chain`: credit new on-chain deposits, post a payout batch."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from marketplace.ledger.anchoring import send_pending
from marketplace.ledger.chain import chain_client, settle_payouts, sync_deposits


class Command(BaseCommand):
    help = "Follow the escrow contract: credit deposits, then settle requested payouts."

    def handle(self, *args: Any, **options: Any) -> None:
        client = chain_client()
        if client is None:
            raise CommandError("the chain is disabled (set GPUFLEX_CHAIN_URL)")
        self.stdout.write(f"deposits credited: {sync_deposits(client)}")
        self.stdout.write(f"provenance anchors sent: {send_pending()}")
        record = settle_payouts(client)
        if record is None:
            self.stdout.write("nothing to settle")
        elif record.failed:
            raise CommandError(f"batch {record.batch_id} was refused: {record.failed}")
        else:
            self.stdout.write(
                f"batch {record.batch_id}: payouts posted {record.posted} (gas "
                f"{record.gas_used}), contributions anchored {record.anchored}"
            )
