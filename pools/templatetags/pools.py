"""Template tags of the pools app: a project's GPU requests and pools, for the project page."""

from __future__ import annotations

from django import template
from django.db.models import QuerySet

from pools import selectors
from portal.permissions import can_request_pools

register = template.Library()

# The project page shows the latest few of each; the tenant's lists page through the rest.
PROJECT_PAGE_LATEST = 10


def _latest(rows: QuerySet, count: int = PROJECT_PAGE_LATEST) -> tuple[list, bool]:
    """The first `count` rows, and whether there are more: one row more is read, never all of them."""
    found = list(rows[: count + 1])
    return found[:count], len(found) > count


@register.inclusion_tag("pools/_project_pools.html", takes_context=True)
def project_pools(context, project) -> dict:
    requests, more_requests = _latest(selectors.project_requests(project=project))
    pools, more_pools = _latest(selectors.project_pools(project=project))
    return {
        "project": project,
        "requests": requests,
        "more_requests": more_requests,
        "pools": pools,
        "more_pools": more_pools,
        "positions": selectors.queue_positions(),
        "user": context["user"],
        "can_request": can_request_pools(user=context["user"], tenant_id=project.tenant_id),
    }


@register.filter
def get_item(mapping, key):
    """`positions|get_item:req.pk` — a dictionary lookup by a variable key."""
    return mapping.get(key)


@register.filter
def waiting_reason(request) -> str:
    """Why a request waits, in the reader's language."""
    return selectors.waiting_reason(request)
