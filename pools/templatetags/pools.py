"""Template tags of the pools app: a project's GPU requests and pools, for the project page."""

from django import template

from pools import selectors
from portal.permissions import can_request_pools

register = template.Library()


@register.inclusion_tag("pools/_project_pools.html", takes_context=True)
def project_pools(context, project):
    return {
        "project": project,
        "requests": selectors.project_requests(project=project),
        "pools": selectors.project_pools(project=project),
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
