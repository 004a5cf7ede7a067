"""{{ node.name|wrappable }}: a long name that wraps after its separators (web/labels.py)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from marketplace.web.labels import wrappable as _wrappable

register = template.Library()


@register.filter
def wrappable(name: object) -> SafeString:
    return _wrappable(str(name))
