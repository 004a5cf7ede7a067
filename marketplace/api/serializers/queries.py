"""Query parameters of read endpoints: a bad value is a 400 naming the parameter, not a 500."""

from __future__ import annotations

from rest_framework import serializers

from marketplace.api.serializers import numbers


class EarningsQuerySerializer(serializers.Serializer):
    days = numbers.IntegerField(
        min_value=1, max_value=366, default=30, help_text="days of daily earnings, 1 to 366"
    )
