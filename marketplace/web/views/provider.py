"""Providers: their nodes (price editable), earnings over time, payouts; API keys for all."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from desktop.money import amount
from marketplace.accounts.errors import KeyLimitReached
from marketplace.accounts.selectors import user_keys
from marketplace.accounts.services import issue_user_key, revoke_key
from marketplace.api.throttles import KeyCreateThrottle
from marketplace.events import topics
from marketplace.events.stream import event_stream
from marketplace.ledger import selectors as ledger
from marketplace.ledger.errors import LedgerError
from marketplace.ledger.services import request_payout
from marketplace.nodes.selectors import (
    benchmark_of,
    network_of,
    nodes_of,
    nodes_owned_by,
    speed_summary,
)
from marketplace.nodes.services import set_price
from marketplace.rounds.selectors import tasks_done_by_node
from marketplace.web.access import provider_required, role_required
from marketplace.web.forms import PayoutForm, PriceForm
from marketplace.web.views.common import not_found


def _node_rows(user: Any) -> list[dict[str, Any]]:
    nodes = nodes_of(user)
    done = tasks_done_by_node(nodes)
    rows = []
    for node in nodes:
        bench = benchmark_of(node)
        rows.append(
            {
                "node": node,
                "tflops": bench.get("fp32_tflops"),
                "device": bench.get("device") or node.gpu_model or "CPU",
                "rtt_ms": network_of(node).get("rtt_ms"),
                "speed": speed_summary(node),
                "tasks_done": done.get(node.pk, 0),
                "earned": ledger.node_earnings(node)["total"],
                "form": PriceForm(
                    initial={"price_per_gpu_hour": node.price_per_gpu_hour},
                    prefix=f"n{node.pk}",
                ),
            }
        )
    return rows


@provider_required
def node_list(request: HttpRequest) -> HttpResponse:
    return render(request, "web/nodes.html", {"rows": _node_rows(request.user)})


@provider_required
@require_POST
def node_price(request: HttpRequest, pk: int) -> HttpResponse:
    node = nodes_of(request.user).filter(pk=pk).first()
    if node is None:
        return not_found(request, "node")
    form = PriceForm(request.POST, prefix=f"n{node.pk}")
    if form.is_valid():
        set_price(node, form.cleaned_data["price_per_gpu_hour"])
        messages.success(request, f"{node.name} now asks {node.price_per_gpu_hour} per GPU-hour.")
    else:
        messages.error(request, "; ".join(e for errs in form.errors.values() for e in errs))
    return redirect("web:nodes")


def _earnings(user: Any) -> dict[str, Any]:
    """The earnings page's figures; the page polls them as JSON to update in place. All of
    them the user's own, an operator's too: tasks done by the nodes whose earnings these are
    (counting every node's tasks beside an operator's own earnings read "74 tasks done" and
    "Nothing earned yet" side by side)."""
    balances = ledger.balances(user).to_dict()
    return {
        "series": [
            [d.isoformat(), str(a), amount(a)] for d, a in ledger.earnings_series(user, days=30)
        ],
        "by_node": [
            r | {"amount": str(r["amount"]), "shown": amount(r["amount"])}
            for r in ledger.earnings_by_node(user)
        ],
        "balances": balances,
        # as every surface shows money (desktop/money.py): the precision it has
        "shown": {k: amount(v) for k, v in balances.items()},
        "tasks_done": sum(tasks_done_by_node(nodes_owned_by(user)).values()),
    }


@provider_required
def earnings(request: HttpRequest) -> HttpResponse:
    form = PayoutForm(request.POST or None, initial={"idempotency_key": secrets.token_hex(16)})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            request_payout(
                user=request.user,
                amount=data["amount"],
                wallet_address=data["wallet_address"],
                idempotency_key=data["idempotency_key"],
            )
        except LedgerError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, f"Payout of {data['amount']} requested.")
            return redirect("web:earnings")
    context = {
        "figures": _earnings(request.user),
        "form": form,
        "payouts": ledger.payouts_for(request.user),
    }
    return render(request, "web/earnings.html", context)


@provider_required
@require_GET
def earnings_live(request: HttpRequest) -> JsonResponse:
    return JsonResponse(_earnings(request.user))


@provider_required
@require_GET
def earnings_events(request: HttpRequest) -> HttpResponse:
    """The earnings page's figures, pushed whenever the provider's money moves."""
    user = request.user
    return event_stream([topics.money(user.pk)], lambda: _earnings(user))


@role_required("buyer", "provider")
def api_keys(request: HttpRequest) -> HttpResponse:
    """Keys for the SDK, the gpuflex command and gpuflex-node login; shown once, at creation."""
    plaintext, status, retry_after = None, 200, None
    if request.method == "POST":
        if "revoke" in request.POST:
            key_id = request.POST["revoke"]
            if not (key_id.isascii() and key_id.isdigit()):  # filter(pk="abc") was a 500
                return HttpResponseBadRequest("revoke: a key id is a whole number.")
            key = user_keys(request.user).filter(pk=int(key_id)).first()
            if key is not None:
                revoke_key(key)
                messages.success(request, f"Key {key.prefix}… revoked.")
            else:
                messages.error(request, "No such key is yours.")
            return redirect("web:keys")
        throttle = KeyCreateThrottle()
        if not throttle.allow_request(request, None):
            retry_after = int(throttle.wait() or 1)
            status = 429
            messages.error(request, f"Too many new keys: try again in {retry_after} s.")
        else:
            try:
                _, plaintext = issue_user_key(request.user, request.POST.get("name", "")[:100])
            except KeyLimitReached as exc:
                status = exc.status
                messages.error(request, exc.detail)
    keys = user_keys(request.user)
    response = render(
        request, "web/keys.html", {"keys": keys, "plaintext": plaintext}, status=status
    )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
