"""Who may open which page: a role check on top of Django's session login."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from marketplace.accounts.models import Role

View = Callable[..., HttpResponse]


def role_required(*roles: str) -> Callable[[View], View]:
    """Anonymous users go to the login page; signed-in users of another role get 403.
    Operators pass every check: they see everything (other people's jobs included)."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            user = request.user
            if not user.is_authenticated:
                # named here rather than in settings.LOGIN_URL: the login page is this app's
                return redirect_to_login(request.get_full_path(), reverse("web:login"))
            if user.role not in roles and user.role != Role.OPERATOR:
                raise PermissionDenied(f"This page is for {' and '.join(roles)} accounts.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


buyer_required = role_required(Role.BUYER)
provider_required = role_required(Role.PROVIDER)
operator_required = role_required(Role.OPERATOR)


def home_for(user: Any) -> str:
    """The page a user lands on after logging in: their own work first."""
    if not user.is_authenticated:
        return "web:market"
    return {
        Role.BUYER: "web:jobs",
        Role.PROVIDER: "web:nodes",
        Role.OPERATOR: "web:operator",
    }.get(user.role, "web:market")
