"""The Django admin shows every model an operator may need, and the ledger only read-only
(issue 36: 8 of 26 models were registered, none of the ledger's)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.test import Client, RequestFactory
from django.urls import reverse

from marketplace.accounts.services import create_user
from marketplace.ledger.models import Account, Entry, Transaction
from marketplace.web.admin import NOT_IN_ADMIN

MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def marketplace_models() -> list:
    return [m for m in apps.get_models() if m.__module__.startswith("marketplace.")]


@pytest.fixture
def superuser(db):
    user = create_user("root", "operator")
    user.is_staff = user.is_superuser = True
    user.save()
    return user


@pytest.fixture
def admin_client(superuser) -> Client:
    client = Client()
    client.force_login(superuser, backend=MODEL_BACKEND)
    return client


def test_every_model_is_in_the_admin_or_said_why_not() -> None:
    missing = [
        m._meta.label
        for m in marketplace_models()
        if not admin.site.is_registered(m) and m._meta.label not in NOT_IN_ADMIN
    ]
    assert missing == []
    for label, why in NOT_IN_ADMIN.items():
        assert why and not admin.site.is_registered(apps.get_model(label)), label


def test_the_ledger_admin_refuses_add_change_and_delete_even_to_a_superuser(superuser) -> None:
    request = RequestFactory().get("/admin/")
    request.user = superuser
    ledger = [m for m in marketplace_models() if m._meta.app_label == "ledger"]
    assert len(ledger) >= 10
    for model in ledger:
        model_admin = admin.site._registry[model]
        assert not model_admin.has_add_permission(request), model
        assert not model_admin.has_change_permission(request), model
        assert not model_admin.has_delete_permission(request), model
        assert model_admin.has_view_permission(request), model
        concrete = {f.name for f in model._meta.get_fields() if f.concrete}
        assert concrete <= set(model_admin.get_readonly_fields(request)), model


def test_the_ledger_cannot_be_edited_through_the_admins_pages(admin_client, make_user) -> None:
    user, _ = make_user("buyer")  # granted credit: an account, a transaction and its entries
    tx = Transaction.objects.filter(entries__account__user=user).first()
    account = Account.objects.get(user=user)
    view = reverse("admin:ledger_transaction_change", args=[tx.pk])
    page = admin_client.get(view)
    assert page.status_code == 200 and b"Save" not in page.content  # a view, not a form
    assert admin_client.post(view, {"memo": "forged"}).status_code == 403
    assert admin_client.get(reverse("admin:ledger_entry_add")).status_code == 403
    delete = reverse("admin:ledger_account_delete", args=[account.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    changelist = reverse("admin:ledger_entry_changelist")
    ids = [str(e.pk) for e in Entry.objects.all()]
    bulk = {"action": "delete_selected", admin.helpers.ACTION_CHECKBOX_NAME: ids, "post": "yes"}
    admin_client.post(changelist, bulk)
    tx.refresh_from_db()
    assert tx.memo != "forged" and Entry.objects.count() == len(ids)
    assert Account.objects.filter(pk=account.pk).exists()


def test_every_changelist_renders_for_a_superuser(admin_client, submit) -> None:
    submit()  # a job with its shards, round, tasks, escrow and ledger rows to list
    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = admin_client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    assert admin_client.get(reverse("admin:index")).status_code == 200
