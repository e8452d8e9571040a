"""Template filters of the pools app's pages."""

from __future__ import annotations

from django import template

from pools import selectors

register = template.Library()


@register.filter
def get_item(mapping, key):
    """`positions|get_item:req.pk` — a dictionary lookup by a variable key."""
    return mapping.get(key)


@register.filter
def waiting_reason(request) -> str:
    """Why a request waits, in the reader's language."""
    return selectors.waiting_reason(request)
