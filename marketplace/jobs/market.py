"""What the market asks of a job: the price cap a buyer gets by default (the median asking
price of the online nodes that fit it), and why no node online takes a job, in figures.

One place for both, so the web form, the API, `gpuflex submit` and every surface that says
why a job waits (the job page, `node_states` in the API, `gpuflex submit --follow`, the demo)
agree on the figures.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from decimal import Decimal

from marketplace.jobs.models import Job, Tier
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import online_nodes
from marketplace.rounds.planning import JobNeeds, may_work_on
from marketplace.rounds.scheduling import job_needs, node_view

# No node online to take the median of: the top of the realistic range the README names
# (1.20-3.00 per reference GPU-hour), so a job submitted before the nodes come online is
# not stranded by its price; its budget still bounds what it spends.
PRICE_WITHOUT_MARKET = Decimal("3.00")
ANY_PRICE = Decimal("Infinity")


def _tier_nodes(tier: str) -> list[Node]:
    """The online nodes a job of `tier` may use: a platform job only the operator's, the
    others every node (volunteers train, platform nodes verify)."""
    nodes = online_nodes()
    if tier == Tier.PLATFORM:
        nodes = nodes.filter(kind=NodeKind.PLATFORM)
    return list(nodes)


def fitting_prices(needs: JobNeeds, tier: str) -> list[Decimal]:
    """The asking prices of the online nodes whose hardware and tier fit, whatever they ask."""
    any_price = replace(needs, max_price=ANY_PRICE)
    return sorted(
        n.price_per_gpu_hour for n in _tier_nodes(tier) if may_work_on(any_price, node_view(n))
    )


def market_price(needs: JobNeeds | None = None, tier: str = Tier.HYBRID) -> Decimal:
    """The default price cap: the median asking price of the online nodes that fit
    (`needs`: the job's requirements; None: no requirements), or PRICE_WITHOUT_MARKET when
    none is online. At the median about half of those nodes take the job, the cheaper half."""
    needs = needs or JobNeeds(ANY_PRICE, 0.0)
    prices = fitting_prices(needs, tier)
    if not prices:
        return PRICE_WITHOUT_MARKET
    return Decimal(statistics.median(prices)).quantize(Decimal("0.0001"))


def shown_price(value: Decimal) -> str:
    """A price as people write it: two decimals ("1.20"), more only where it has them."""
    cents = value.quantize(Decimal("0.01"))
    return str(cents) if cents == value else str(value.normalize())


def why_no_node(job: Job) -> str:
    """Why no online node can take `job`, in figures: "no node online at or under 1.00; the
    cheapest that fits asks 1.20", or what its requirements ask that no node has."""
    online = _tier_nodes(job.tier)
    needs = job_needs(job)
    if not online:
        where = "no platform node online" if job.tier == Tier.PLATFORM else "no node online"
        return f"{where}: the job waits for one to come online"
    fits = fitting_prices(needs, job.tier)
    if fits and fits[0] <= needs.max_price:  # not the price: nodes fit and take it
        noun = "node fits" if len(fits) == 1 else "nodes fit"
        return f"{len(fits)} online {noun} it at or under {shown_price(needs.max_price)}"
    if fits:
        return (
            f"no node online at or under {shown_price(needs.max_price)}; the cheapest that "
            f"fits asks {shown_price(fits[0])} (raise the job's max price to use it)"
        )
    runtime_free = replace(needs, gpu_runtime=False, min_torch="")
    if runtime_free != needs and fitting_prices(runtime_free, job.tier):
        return (
            "the online nodes that fit its hardware cannot run it with their training runtime: "
            f"it needs {_runtime_asks(needs)} (a node gets one with `gpuflex-node runtime "
            "fetch`, docs/runtime-packs.md)"
        )
    return "no node online has what the job requires: " + _requirements(job, needs)


def _runtime_asks(needs: JobNeeds) -> str:
    asks = []
    if needs.gpu_runtime:
        asks.append("a GPU runtime (cuda12, cuda13, rocm or mps) for its bf16/fp16 precision")
    if needs.min_torch:
        asks.append(f"torch {needs.min_torch} or newer")
    return " and ".join(asks)


def _requirements(job: Job, needs: JobNeeds) -> str:
    asks = [f"{needs.min_memory_gb:.3g} GB of memory"]
    if needs.gpu_required or needs.min_vram_gb > 0:
        asks.append("a GPU" + (f" with {needs.min_vram_gb:g} GB" if needs.min_vram_gb else ""))
    if needs.min_fp32_tflops > 0:
        asks.append(f"{needs.min_fp32_tflops:g} fp32 TFLOP/s")
    if needs.isolation_full:
        asks.append("full sandbox isolation")
    if needs.gpu_runtime or needs.min_torch:
        asks.append(_runtime_asks(needs))
    if job.tier == Tier.PLATFORM:
        asks.append("a platform node")
    return ", ".join(asks)
