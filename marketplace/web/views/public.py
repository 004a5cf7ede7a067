"""Pages anyone may open: the market, sign up, log in and out, the benchmark comparison."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from axes.helpers import get_cool_off
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.views import LoginView, LogoutView
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from marketplace.accounts.services import create_user
from marketplace.api.throttles import SignupThrottle
from marketplace.jobs.selectors import jobs_by_status
from marketplace.nodes.selectors import market_capacity
from marketplace.web import compare
from marketplace.web.access import home_for
from marketplace.web.forms import LoginForm, SignupForm


def market(request: HttpRequest) -> HttpResponse:
    capacity = market_capacity()
    jobs = jobs_by_status()
    prices = [Decimal(g["min_price_per_gpu_hour"]) for g in capacity["gpus"]]
    context = {
        "capacity": capacity,
        "jobs_running": jobs.get("running", 0),
        "jobs_completed": jobs.get("completed", 0),
        # a GPU's memory, or for a CPU node the RAM its tasks may use (as nodes register it)
        "memory_gb": round(sum(g["memory_gb"] for g in capacity["gpus"]), 1),
        "device_models": len({g["gpu_model"] for g in capacity["gpus"]}),
        "cheapest": min(prices, default=None),
    }
    return render(request, "web/market.html", context)


def signup(request: HttpRequest) -> HttpResponse:
    # ?role=provider preselects the provider choice (the market's "Rent out your GPU")
    form = SignupForm(request.POST or None, initial={"role": request.GET.get("role", "buyer")})
    if request.method == "POST":
        # sign-ups per address (GPUFLEX_THROTTLE_SIGNUP): 30 accounts in 21 s went through
        throttle = SignupThrottle()
        # counted before the account is made (so a burst cannot all pass a check made
        # first), given back if none is
        wait = throttle.reserve(request)
        if wait is not None:
            return _too_many(request, "web/signup.html", {"form": form}, wait, "new accounts")
        created = False
        try:
            if form.is_valid():
                data = form.cleaned_data
                with transaction.atomic():
                    user = create_user(data["username"], data["role"], data["email"])
                    # create_user leaves API-key-only accounts without a password; the web
                    # needs one
                    user.set_password(data["password"])
                    user.save(update_fields=["password"])
                created = True
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
                messages.success(request, f"Welcome to GPUFlex, {user.username}.")
                return redirect(home_for(user))
        finally:
            if not created:
                throttle.release(request)
    return render(request, "web/signup.html", {"form": form})


def _too_many(
    request: HttpRequest, template: str, context: dict[str, Any], wait: float, what: str
) -> HttpResponse:
    seconds = max(1, math.ceil(wait))
    context = context | {"error": f"Too many {what} from your address: try again in {seconds} s."}
    response = render(request, template, context, status=429)
    response["Retry-After"] = str(seconds)
    return response


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """django-axes' answer to a login while its name and address are locked out
    (AXES_LOCKOUT_CALLABLE): the login page again, 429, and when to come back."""
    cool_off = get_cool_off(request)
    wait = cool_off.total_seconds() if cool_off else 3600.0
    form = LoginForm(request, data=None)
    return _too_many(request, "web/login.html", {"form": form}, wait, "failed log-ins")


class WebLoginView(LoginView):
    template_name = "web/login.html"
    authentication_form = LoginForm
    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        return reverse(home_for(self.request.user))


class WebLogoutView(LogoutView):
    next_page = "web:market"


def comparison(request: HttpRequest) -> HttpResponse:
    results = compare.load_results()
    context = {"results": results, "data": compare.chart_data(results) if results else None}
    return render(request, "web/compare.html", context)
