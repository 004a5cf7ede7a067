"""Figures and labels on the web pages as a newcomer read them wrong (issue 37): the market's
GPU and benchmark columns, amounts rounded to nothing, node names cut to the same prefix, an
operator's earnings and nodes pages, and the comparison page's title."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.test import Client

from marketplace.ledger import accounts
from marketplace.ledger.posting import post
from marketplace.nodes.models import Node
from marketplace.nodes.selectors import market_capacity
from marketplace.nodes.services import register_node
from marketplace.web.jobview import TOPOLOGY_LABEL_CHARS, topology
from marketplace.web.labels import short_label, short_labels, wrappable
from marketplace.web.templatetags.figures import significant
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC
from tests.web.conftest import agent_for, run_until_idle

pytestmark = pytest.mark.django_db

DEMO_NAMES = ["platform-lan", "volunteer-wan-a", "volunteer-wan-b", "volunteer-wan-c"]


def _cpu(node: Node, fp32: float) -> Node:
    """The node as a CPU-only machine registers: no GPU model, its CPU's measured figures."""
    node.gpu_model = ""
    node.benchmark = {"device": "AMD EPYC 7B13", "fp32_tflops": fp32}
    node.save(update_fields=["gpu_model", "benchmark"])
    return node


def _cells(html: str, testid: str) -> list[str]:
    return [
        re.sub(r"<[^>]+>", "", m).strip()
        for m in re.findall(rf'data-testid="{testid}">(.*?)</td>', html, re.S)
    ]


# -- the market and the nodes pages -------------------------------------------------------


def test_market_names_cpu_nodes_and_shows_their_benchmark(make_user, make_node) -> None:
    provider = make_user("provider")
    _cpu(make_node(provider, kind="volunteer"), 0.00277)
    _cpu(make_node(provider, kind="volunteer"), 0.00061)
    make_node(provider)  # an RTX 4090 platform node advertising 80 TFLOP/s
    html = Client().get("/").content.decode()
    gpus = _cells(html, "gpu")
    assert "unknown" not in gpus and sorted(gpus) == ["CPU", "RTX 4090"]
    benchmarks = _cells(html, "benchmark")
    assert "0.000610 – 0.00277 TFLOP/s" in benchmarks and "80.0 TFLOP/s" in benchmarks
    assert "0.00 TFLOP/s" not in html
    assert 'data-testid="device-models">2<' in html  # CPU and RTX 4090, each kind once


def test_market_capacity_names_cpu_nodes(make_user, make_node) -> None:
    """What the page and the API's market/capacity give."""
    provider = make_user("provider")
    _cpu(make_node(provider), 0.003)
    gpus = market_capacity()["gpus"]
    assert [(g["gpu_model"], g["min_fp32_tflops"]) for g in gpus] == [("CPU", 0.003)]


def test_nodes_page_shows_a_small_benchmark_and_earnings(make_user, make_node, login) -> None:
    provider = make_user("provider")
    node = _cpu(make_node(provider), 0.00277)
    html = login(provider).get("/nodes/").content.decode()
    assert "0.00277 TFLOP/s fp32" in html and "under your account" in html
    assert f'data-node="{node.pk}"' in html


def test_the_operators_all_nodes_page_does_not_say_your_account(make_user, make_node, login):
    make_node(make_user("provider"))
    html = login(make_user("operator")).get("/nodes/").content.decode()
    assert "All nodes" in html and "under your account" not in html
    assert "Every node registered on this marketplace" in html


@pytest.mark.parametrize(
    ("value", "shown"),
    [(82.6, "82.6"), (0.00277, "0.00277"), (0.000611, "0.000611"), (1234.5, "1,234"),
     (19.99, "20.0"), (0, "0"), (None, "—"), (float("nan"), "—")],
)  # fmt: skip
def test_significant_digits(value, shown) -> None:
    assert significant(value) == shown


# -- amounts ------------------------------------------------------------------------------


def _earn(user, amount: str) -> None:
    post(f"test-earn-{user.pk}-{amount}", "grant", [
        (accounts.external_grants(), Decimal(f"-{amount}")),
        (accounts.provider_earnings(user), Decimal(amount)),
    ])  # fmt: skip


def test_earnings_show_small_amounts_with_their_digits(make_user, login) -> None:
    provider = make_user("provider")
    _earn(provider, "0.000842")
    client = login(provider)
    html = client.get("/earnings/").content.decode()
    assert 'data-testid="earnings">0.000842<' in html
    live = client.get("/earnings/live/").json()
    assert live["shown"]["earnings"] == "0.000842"
    assert Decimal(live["balances"]["earnings"]) == Decimal("0.000842")  # the ledger's


def test_a_buyers_balance_shows_small_amounts(make_user, login) -> None:
    buyer = make_user("buyer", credit="0.0005")
    html = login(buyer).get("/jobs/").content.decode()
    assert 'data-testid="credit">0.000500<' not in html
    assert 'data-testid="credit">0.0005<' in html


# -- an operator's own earnings -----------------------------------------------------------


def test_an_operators_earnings_count_their_own_nodes_tasks(
    make_user, make_node, make_job, login, django_capture_on_commit_callbacks
) -> None:
    """Tasks done by other people's nodes beside the operator's own (nil) earnings read
    "TASKS DONE 74" and "Nothing earned yet" side by side."""
    job = make_job(make_user("buyer"), spec_data=SMALL_SPEC | {"rounds": {"max_rounds": 1}})
    agents = [agent_for(make_node(make_user("provider"))) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        assert run_until_idle(agents) > 0
    job.refresh_from_db()
    assert job.status == "completed"
    operator = login(make_user("operator"))
    figures = operator.get("/earnings/live/").json()
    assert figures["tasks_done"] == 0 and figures["by_node"] == []
    html = operator.get("/earnings/").content.decode()
    assert 'data-testid="tasks-total">0<' in html and "Nothing earned yet." in html


# -- labels -------------------------------------------------------------------------------


def test_short_labels_keep_demo_nodes_apart() -> None:
    labels = short_labels(DEMO_NAMES, TOPOLOGY_LABEL_CHARS)
    assert len(set(labels)) == len(labels)
    assert all(len(label) <= TOPOLOGY_LABEL_CHARS for label in labels)
    assert labels[0] == "platform-lan"  # fits: whole
    assert labels[1].endswith("wan-a") and labels[1] != DEMO_NAMES[1][:TOPOLOGY_LABEL_CHARS]
    # names that differ only in the middle keep their distinct end instead
    twins = short_labels(["node-aaaaaaaaaaaaaa-1", "node-aaaaaaaaaaaaab-1"], 12)
    assert len(set(twins)) == 2
    assert short_label("abc", 2) == "ab"


def test_the_network_map_gives_each_node_a_distinct_label_and_its_name() -> None:
    rows = [{"name": n} for n in DEMO_NAMES]
    nodes = topology(rows)["nodes"]
    assert [n["name"] for n in nodes] == DEMO_NAMES  # the full name, for the SVG <title>
    assert len({n["label"] for n in nodes}) == len(DEMO_NAMES)


def test_wrappable_breaks_after_separators_and_escapes() -> None:
    assert wrappable("volunteer-wan-a") == "volunteer-<wbr>wan-<wbr>a"
    assert wrappable("<b>-x") == "&lt;b&gt;-<wbr>x"


def test_operator_heatmap_names_wrap_with_a_tooltip(make_user, login) -> None:
    owner = make_user("provider")
    for name in DEMO_NAMES[1:]:
        register_node(owner=owner, name=name, kind="volunteer", enrollment_token=None,
                      hardware=HARDWARE, benchmark={"fp32_tflops": 1.0},
                      network={"rtt_ms": 30.0}, price_per_gpu_hour=Decimal("1.00"),
                      availability={})  # fmt: skip
    html = login(make_user("operator")).get("/operator/").content.decode()
    heatmap = html[html.index('data-testid="heatmap"') :]
    heatmap = heatmap[: heatmap.index("</table>")]
    assert "volunteer…" not in heatmap
    for name in DEMO_NAMES[1:]:
        assert f'title="{name}"' in heatmap
        assert "volunteer-<wbr>wan-<wbr>" + name[-1] in heatmap


# -- the comparison page ------------------------------------------------------------------


def test_the_comparison_page_says_its_times_are_the_simulators() -> None:
    html = Client().get("/compare/").content.decode()
    assert "measured" not in html.split("<h1", 1)[1].split("</h1>", 1)[0]
    if 'data-testid="compare-title"' in html:  # with bench results on this checkout
        assert "simulator" in html
