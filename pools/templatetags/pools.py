"""Template filters of the pools app's pages."""

from __future__ import annotations

from django import template

from pools import selectors
from pools.specs import profile_label

register = template.Library()


@register.filter
def get_item(mapping, key):
    """`positions|get_item:req.pk` — a dictionary lookup by a variable key."""
    return mapping.get(key)


@register.filter
def waiting_reason(request) -> str:
    """Why a request waits, in the reader's language."""
    return selectors.waiting_reason(request)


@register.filter
def event_reason(event, request) -> str:
    """`event|event_reason:req` — an event's why, in the reader's language when it is the request's
    current waiting reason (whose template is stored); other reasons are people's or systems' own words."""
    return selectors.event_reason(event, request)


@register.filter
def profile(name: str) -> str:
    """`a.profile|profile` — a MIG profile's name, or "full" in the reader's language."""
    return profile_label(name)


@register.filter
def reason(data) -> str:
    """`verdict.reason_data|reason` — a reason kept as its template and values, in the reader's language."""
    return selectors.render_reason(data) if data else ""
