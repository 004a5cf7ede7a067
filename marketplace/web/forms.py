"""Forms of the web pages. Each checks its input's shape; the services check the rules."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.auth import password_validation
from django.contrib.auth.forms import AuthenticationForm

from marketplace.accounts.models import Role, User
from marketplace.jobs.market import shown_price
from marketplace.jobs.models import Tier
from marketplace.numbers import NOT_ASCII, is_ascii_text

EXAMPLE_SPEC = """\
# A small MLP on the built-in handwritten digits, trained with FedAvg.
name: digits-mlp
seed: 0
dataset:
  kind: digits          # built in; or csv / npz / parquet / image_folder / text with a file
  test_fraction: 0.2
model:
  arch: mlp
  hidden: [64]
optimizer:
  name: sgd
  lr: 0.2
local:
  steps: 20
  batch_size: 32
rounds:
  max_rounds: 10
  target:
    metric: accuracy
    value: 0.95
sharding:
  method: stratified
  num_shards: 4
"""


class DecimalField(forms.DecimalField):
    """Django's, taking the digits 0-9 only (marketplace/numbers.py): Decimal() reads
    Arabic-Indic and full-width digits as numbers too."""

    def to_python(self, value: object) -> Decimal | None:
        if not is_ascii_text(value):
            raise forms.ValidationError(f"Enter a number: {NOT_ASCII}.", code="invalid")
        return super().to_python(value)


class SignupForm(forms.Form):
    # operators are made by other operators (admin or `gpuflex manage create_account`)
    ROLES = (
        (Role.BUYER, "I want to train models (buyer)"),
        (Role.PROVIDER, "I want to rent out my GPU (provider)"),
    )

    username = forms.RegexField(
        regex=r"^[\w.@+-]+$",
        max_length=150,
        error_messages={"invalid": "Use letters, digits and @ . + - _ only."},
    )
    email = forms.EmailField(required=False)
    role = forms.ChoiceField(choices=ROLES, widget=forms.RadioSelect, initial=Role.BUYER)
    # the project configures no password validators (API keys came first): at least a length
    password = forms.CharField(
        widget=forms.PasswordInput,
        strip=False,
        min_length=8,
        error_messages={"min_length": "This password is too short: use at least 8 characters."},
    )

    def clean_username(self) -> str:
        name = self.cleaned_data["username"]
        if User.objects.filter(username__iexact=name).exists():
            raise forms.ValidationError("That name is taken.")
        return name

    def clean(self) -> dict:
        data = super().clean()
        if "password" in data:
            probe = User(username=data.get("username", ""), email=data.get("email", ""))
            try:
                password_validation.validate_password(data["password"], probe)
            except forms.ValidationError as exc:
                self.add_error("password", exc)
        return data


class LoginForm(AuthenticationForm):
    pass


class JobForm(forms.Form):
    spec = forms.CharField(
        widget=forms.Textarea(
            attrs={"rows": 24, "spellcheck": "false", "wrap": "off", "class": "code"}
        ),
        initial=EXAMPLE_SPEC,
        help_text="YAML or JSON, as in examples/.",
    )
    dataset = forms.FileField(
        required=False,
        help_text="CSV, NPZ, Parquet, an image archive or text; empty for a built-in dataset.",
    )
    # set by the page's script once a large file's chunked upload is finished (upload.js)
    dataset_upload = forms.UUIDField(required=False, widget=forms.HiddenInput)
    tier = forms.ChoiceField(choices=Tier.choices, initial=Tier.HYBRID)
    budget = DecimalField(
        min_value=Decimal("0"), max_digits=12, decimal_places=4, initial=Decimal("5")
    )
    max_price_per_gpu_hour = DecimalField(
        label="Max price per GPU-hour",
        min_value=Decimal("0.0001"),  # more than 0: a job at 0 hired nodes all the same
        max_digits=10,
        decimal_places=4,
    )
    federated_dataset = forms.RegexField(
        regex=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=100,
        required=False,
        label="Federated: local dataset",
        help_text="Optional. Train on the nodes holding this named local dataset, which never "
        "leaves them (sharding.method: prepartitioned, local.steps); the spec's dataset is "
        "then only evaluated on. Verified by statistical checks, not replicas.",
        error_messages={"invalid": "A dataset name: letters, digits, '_', '.', '-'."},
    )

    def __init__(self, *args: Any, market_price: Decimal, online: bool, **kwargs: Any) -> None:
        """`market_price`: the default cap, the market's price now (jobs/market.py)."""
        super().__init__(*args, **kwargs)
        field = self.fields["max_price_per_gpu_hour"]
        field.initial = market_price
        price = shown_price(market_price)
        field.help_text = (
            f"By default the median asking price of the nodes online now ({price}): about "
            "half of them take the job. Lower waits for cheaper nodes; higher uses more."
            if online
            else f"No node is online now; {price} is the top of the usual range."
        )


class PriceForm(forms.Form):
    price_per_gpu_hour = DecimalField(
        label="Price per GPU-hour", min_value=Decimal("0"), max_digits=10, decimal_places=4
    )


class PayoutForm(forms.Form):
    amount = DecimalField(min_value=Decimal("0.0001"), max_digits=12, decimal_places=4)
    wallet_address = forms.RegexField(
        regex=r"^0x[0-9a-fA-F]{40}$",
        error_messages={"invalid": "A wallet address is 0x followed by 40 hex digits."},
    )
    # one per rendered form: a double click or a resubmitted page pays once
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=64)
