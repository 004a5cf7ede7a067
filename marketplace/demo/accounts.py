"""The demo's people: an operator, a buyer with credit and a provider, each with an API key
and a password for the web UI (printed by `gpuflex demo --serve`). Needs Django set up."""

from __future__ import annotations

from dataclasses import dataclass

PASSWORD = "gpuflex-demo"
CREDIT = "100.00"


@dataclass(frozen=True)
class Login:
    username: str
    role: str
    key: str


def create_people() -> dict[str, Login]:
    from marketplace.accounts.models import User
    from marketplace.accounts.services import create_user, issue_user_key
    from marketplace.ledger.services import grant_credit

    people = {}
    for username, role in (("operator", "operator"), ("buyer", "buyer"), ("provider", "provider")):
        user = User.objects.filter(username=username).first() or create_user(username, role)
        user.set_password(PASSWORD)
        if role == "operator":
            user.is_staff = user.is_superuser = True  # Django admin for the rest
        user.save()
        _, key = issue_user_key(user, name="gpuflex demo")
        people[role] = Login(username, role, key)
    buyer = User.objects.get(username="buyer")
    grant_credit(user=buyer, amount=CREDIT, memo="demo credit", operator=None, key="grant:demo")
    return people
