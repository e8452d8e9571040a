"""Template filters of the pools app's pages."""

from __future__ import annotations

from django import template
from django.utils.translation import gettext_lazy

from pools import selectors
from pools.kinds import shown_slices
from pools.placement.fleet_changes import ADD, REGROUP, REMOVE
from pools.selectors.binding import claim_name, claimed
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
def claim_of(allocation, cluster) -> str:
    """`a|claim_of:pool.cluster` — the ResourceClaim the portal made for the allocation, "" for none."""
    return claim_name(allocation) if claimed(allocation, cluster) else ""


@register.filter
def profile(name: str) -> str:
    """`a.profile|profile` — a MIG profile's name, or "full" in the reader's language."""
    return profile_label(name)


@register.filter
def grouped(amount) -> str:
    """An amount already rounded, with digit groups: `1,500,000`, `12.50`; nothing known → an em dash."""
    return "—" if amount is None or amount == "" else f"{amount:,}"


@register.filter
def reason(data) -> str:
    """`verdict.reason_data|reason` — a reason kept as its template and values, in the reader's language."""
    return selectors.render_reason(data) if data else ""


# A fleet change's kind as the what-if pages name it, in the reader's language.
CHANGE_KINDS = {ADD: gettext_lazy("add"), REMOVE: gettext_lazy("remove"), REGROUP: gettext_lazy("regroup")}


@register.filter
def fleet_change(pair) -> str:
    """`change|fleet_change` — a kept what-if run's [kind, text] as "add: 8 H200-141GB training"."""
    kind, text = pair
    return f"{CHANGE_KINDS.get(kind, kind)}: {text}"


@register.filter
def whatif_error(run) -> str:
    """Why a what-if run failed: in the reader's language where the portal wrote it, else as it came."""
    return selectors.render_reason(run.error_data) if run.error_data else run.error


@register.filter
def percent(share) -> str:
    """`run.progress|percent` — a share from 0 to 1 as a whole percentage."""
    return f"{round(float(share or 0) * 100)} %"


@register.filter
def slices(value) -> int | float:
    """Compute slices as people read them: a whole number, or with a share's fraction, to two decimals."""
    return shown_slices(value)
