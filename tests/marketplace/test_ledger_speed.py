"""Nodes cannot lie about their speed: the observed throughput of their tasks, compared with
their peers' on the same job, replaces an inflated benchmark in billing (docs/money.md)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.ledger import speed
from marketplace.ledger.metering import Rules, meter
from marketplace.ledger.models import Transaction
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.services import charge_result
from marketplace.nodes.models import Node, NodeSpeed
from marketplace.rounds.models import Round, Task, TaskResult

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def judged_by_speed(settings) -> None:
    """The deployment's margin (the test settings turn speed judging off elsewhere)."""
    settings.GPUFLEX = settings.GPUFLEX | {"SPEED_MARGIN": 2.0}


PRICE = "3.00"  # per reference (20 TFLOP/s) GPU-hour
SECONDS = 60.0  # what every node reports for the same work: all of them are equally fast


def test_the_reference_is_the_upper_median_of_the_nodes_and_needs_two() -> None:
    assert speed.reference_utilization({1: [0.2]}) is None  # a lone node cannot be judged
    # honest 0.2, a cheater advertising 8x: 0.025; the upper median of two is the honest one
    assert speed.reference_utilization({1: [0.2, 0.2], 2: [0.025]}) == 0.2
    assert speed.reference_utilization({1: [0.2], 2: [0.1], 3: [0.025]}) == 0.1
    # a node claiming to train above its own peak cannot drag the others down past 1
    assert speed.reference_utilization({1: [0.2], 2: [50.0]}) == 1.0
    assert speed.achieved_tflops(10**6, 1000, 2.0) == pytest.approx(6e9 / 2 / 1e12)
    assert speed.achieved_tflops(10**6, 1000, 0.0) is None


def test_billing_uses_the_observed_figure_only_past_the_margin_and_never_raises_it() -> None:
    assert speed.verdict(160.0, 20.0, 2.0).billed == 20.0  # 8x: caught
    assert speed.verdict(160.0, 20.0, 2.0).mismatch
    assert speed.verdict(30.0, 20.0, 2.0).billed == 30.0  # within the margin: trusted
    assert speed.verdict(10.0, 20.0, 2.0).billed == 10.0  # under-advertised: never more
    assert speed.verdict(160.0, None, 2.0).billed == 160.0  # not judged yet
    assert "160" in speed.verdict(160.0, 20.0, 2.0).note()


def _job(submit) -> Job:
    job = Job.objects.get(pk=submit(tier="platform", budget="100")["id"])
    assert job.input_shape, "the job's model is prepared"
    return job


def _settle(job: Job, node: Node, n: int = 1) -> list[Transaction]:
    """`n` tasks of the same work (8 steps of 32), each reported at SECONDS and seen by the
    server for longer; credited as an aggregation would, then charged for real."""
    rnd = Round.objects.filter(job=job).order_by("number").first()
    results = []
    for _ in range(n):
        task = Task.objects.create(
            round=rnd, seed=0, steps=8, batch_size=32, node=node, status="done",
            leased_at=timezone.now() - timedelta(seconds=SECONDS + 5),
            price_per_gpu_hour=node.price_per_gpu_hour, replica=0,
        )  # fmt: skip
        result = TaskResult.objects.create(
            task=task, node=node, update_file="u", update_hash="h", num_samples=256,
            compute_s=SECONDS, credited=True,
        )  # fmt: skip
        results.append(result)
    return [charge_result(r) for r in results]


def test_a_node_advertising_8x_its_speed_is_paid_like_its_real_speed(
    make_agent, submit, provider
) -> None:
    honest = [make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 20})
              for _ in range(2)]  # fmt: skip
    liar = make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 160})
    job = _job(submit)
    honest_nodes = [Node.objects.get(pk=a.node_id) for a in honest]
    cheater = Node.objects.get(pk=liar.node_id)
    for node in honest_nodes:
        _settle(job, node)
    before = cheater.reliability
    cheats = _settle(job, cheater, n=2)
    honests = _settle(job, honest_nodes[0], n=2)

    honest_net = Decimal(honests[-1].details["net"])
    cheat_net = Decimal(cheats[-1].details["net"])
    # what the cheater would have been paid on its word: 8x (the speed factor's cap)
    rules = Rules.from_settings()
    on_its_word = meter(reported_s=SECONDS, observed_s=SECONDS, fp32_tflops=160.0,
                        price_per_hour=Decimal(PRICE), cosine=None, rules=rules)  # fmt: skip
    print(f"\nper task: honest node net {honest_net}, cheater net {cheat_net}, "
          f"cheater on its benchmark's word {on_its_word.net}")  # fmt: skip
    assert on_its_word.net == 8 * honest_net
    assert cheat_net == honest_net  # paid like its real speed
    assert cheats[0].details["billed_tflops"] == pytest.approx(20.0)
    assert cheats[0].details["advertised_tflops"] == 160.0

    cheater.refresh_from_db()
    assert cheater.speed_mismatches == 2 and cheater.reliability < before
    seen = NodeSpeed.objects.get(node=cheater)
    assert seen.mismatch and seen.observed_tflops == pytest.approx(20.0)
    honest_speed = NodeSpeed.objects.get(node=honest_nodes[0])
    assert not honest_speed.mismatch and honest_speed.billed_tflops == 20.0
    assert Node.objects.get(pk=honest_nodes[0].pk).speed_mismatches == 0

    # the provider sees why: the API's node detail and the nodes page
    detail = provider.get(f"/api/v1/nodes/{cheater.pk}/").json()
    assert detail["speed"]["mismatch"] is True and detail["speed_mismatches"] == 2
    assert "Advertises 160 fp32 TFLOP/s" in detail["speed"]["note"]
    assert provider.get(f"/api/v1/nodes/{honest_nodes[1].pk}/").json()["speed"]["mismatch"] is False
    assert reconcile(with_chain=False).ok


def test_the_nodes_page_shows_the_provider_why(make_agent, submit, client) -> None:
    honest = make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 20})
    liar = make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 160})
    job = _job(submit)
    _settle(job, Node.objects.get(pk=honest.node_id))
    _settle(job, Node.objects.get(pk=liar.node_id))
    client.force_login(Node.objects.get(pk=liar.node_id).owner)
    page = client.get("/nodes/").content.decode()
    assert 'data-testid="speed-note"' in page and "Advertises 160" in page
    assert "too slow for its benchmark" in page


def test_a_lone_node_is_not_judged(make_agent, submit) -> None:
    liar = make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 160})
    job = _job(submit)
    tx = _settle(job, Node.objects.get(pk=liar.node_id))[0]
    assert tx.details["billed_tflops"] == 160.0  # no peer to compare with: its word stands
    assert Node.objects.get(pk=liar.node_id).speed_mismatches == 0


@pytest.mark.django_db(transaction=True)
def test_through_real_uploads_the_inflated_node_earns_what_its_peers_earn(
    make_agent, submit, buyer
) -> None:
    """Three nodes train the same round for real and report the same time; one advertises
    8x its peers' benchmark. Settlement pays it like them."""
    from tests.marketplace.test_ledger_jobs import work_all

    honest = [make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 20})
              for _ in range(2)]  # fmt: skip
    liar = make_agent(kind="platform", price=PRICE, benchmark={"fp32_tflops": 160})
    job = submit(tier="platform", budget="20", max_price_per_gpu_hour="5",
                 spec={**_small_spec(), "rounds": {"max_rounds": 1}})  # fmt: skip
    assert work_all([liar, *honest]) == 3
    assert buyer.get(f"/api/v1/jobs/{job['id']}/").json()["status"] == "completed"
    paid = {
        tx.node_id: Decimal(tx.details["base"])
        for tx in Transaction.objects.filter(job_id=job["id"], kind="charge")
    }
    assert len(paid) == 3
    assert paid[liar.node_id] == paid[honest[0].node_id] == paid[honest[1].node_id]
    assert Node.objects.get(pk=liar.node_id).speed_mismatches == 1
    assert all(Node.objects.get(pk=a.node_id).speed_mismatches == 0 for a in honest)


def _small_spec() -> dict:
    from tests.marketplace.helpers import SMALL_SPEC

    return dict(SMALL_SPEC)
