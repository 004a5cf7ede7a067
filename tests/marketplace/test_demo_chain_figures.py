"""What `gpuflex demo --chain` reports (marketplace/demo/chain.py), on Hardhat's JSON-RPC node:
a verified contribution counts as settled once its batch is confirmed on chain, and as a
record on chain only where the chain itself verifies its leaf against the anchored root."""

from __future__ import annotations

import pytest

pytest.importorskip("web3")

from marketplace.demo.chain import settlement_figures, unsettled
from marketplace.jobs.models import Job
from marketplace.ledger import chain as ledger_chain
from tests.marketplace.chain_payouts import configure_rpc, earn_from_a_paid_job, restart
from tests.marketplace.helpers import client_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rpc(settings, rpc_chain):
    configure_rpc(settings, rpc_chain)
    client = restart()
    snapshot = client.w3.testing.snapshot()  # the node lives for the session
    yield client
    client.w3.testing.revert(snapshot)
    ledger_chain.use_client(None)


def test_contributions_settle_on_chain_and_only_what_the_chain_holds_counts(
    rpc, make_user, make_agent, provider
):
    _, buyer_key = make_user("buyer")
    earn_from_a_paid_job(client_for(buyer_key), provider, make_agent)  # 3 nodes, one round
    job_id = str(Job.objects.get().pk)

    before = settlement_figures(job_id)
    assert (before["contributions"], before["settled"], before["on_chain_records"]) == (3, 0, 0)
    assert before["settlement_p50_s"] is None and not before["every_contribution_on_chain"]
    assert unsettled(job_id) == 3

    unanchored = rpc.w3.testing.snapshot()
    record = ledger_chain.settle_payouts(rpc)
    assert record is not None and record.anchored and not record.failed
    after = settlement_figures(job_id)
    assert unsettled(job_id) == 0
    assert after["settled"] == after["on_chain_records"] == 3
    assert after["on_chain_per_round"] == [{"round": 1, "verified": 3, "on_chain": 3}]
    assert after["every_contribution_on_chain"]
    assert 0 <= after["settlement_p50_s"] <= after["settlement_max_s"]

    # the ledger still says anchored, but the chain no longer holds the root: not on chain
    rpc.w3.testing.revert(unanchored)
    gone = settlement_figures(job_id)
    assert gone["settled"] == 3 and gone["on_chain_records"] == 0
    assert not gone["every_contribution_on_chain"]
