"""The API's number fields: DRF's, taking the digits 0-9 only (marketplace/numbers.py).

DRF's IntegerField and DecimalField parse text with int() and Decimal(), which read every
Unicode digit; these refuse text with anything outside ASCII first, as a 400 naming the
field. Every serializer field that takes a count or an amount is one of these."""

# ruff: noqa: RUF012 - DRF declares error messages as class attributes

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from marketplace.numbers import NOT_ASCII, is_ascii_text


class IntegerField(serializers.IntegerField):
    default_error_messages = {"not_ascii": f"A whole number is required: {NOT_ASCII}."}

    def to_internal_value(self, data: Any) -> int:
        if not is_ascii_text(data):
            self.fail("not_ascii")
        return super().to_internal_value(data)


class DecimalField(serializers.DecimalField):
    default_error_messages = {"not_ascii": f"A decimal number is required: {NOT_ASCII}."}

    def to_internal_value(self, data: Any) -> Any:
        if not is_ascii_text(data):
            self.fail("not_ascii")
        return super().to_internal_value(data)
