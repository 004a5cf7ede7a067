"""Who may call what. Object visibility is enforced by scoping querysets (404, not 403)."""

from __future__ import annotations

from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from marketplace.accounts.models import Role


def _user_key(request: Request) -> bool:
    return request.auth is not None and request.auth.node_id is None


class IsNode(BasePermission):
    message = "This endpoint needs a node key (gfx_n_…)."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return request.auth is not None and request.auth.node_id is not None


class IsUser(BasePermission):
    message = "This endpoint needs a user key (gfx_u_…), not a node key."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return _user_key(request)


class IsProvider(BasePermission):
    message = "Only providers (GPU owners) and operators can do this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return _user_key(request) and request.user.role in (Role.PROVIDER, Role.OPERATOR)


class IsBuyer(BasePermission):
    message = "Only buyers and operators can do this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return _user_key(request) and request.user.role in (Role.BUYER, Role.OPERATOR)


class IsOperator(BasePermission):
    message = "Only platform operators can do this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return _user_key(request) and request.user.role == Role.OPERATOR
