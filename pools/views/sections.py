"""The pools app's parts of the shell's pages (`AppPlugin` sections and figures): a project's latest
requests and pools, a tenant's live pools and waiting requests, and each tenant's figures on the home page."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import ngettext

from pools import selectors
from pools.models import PoolState
from pools.selectors.quotas import borrowed_pool_ids, tenant_quotas
from pools.views.refresh import refresh_while
from portal import shell
from portal.permissions import can_request_pools

# The project page shows the latest few of each; the tenant's lists page through the rest.
PROJECT_PAGE_LATEST = 10


def _latest(rows: QuerySet, count: int = PROJECT_PAGE_LATEST) -> tuple[list, bool]:
    """The first `count` rows, and whether there are more: one row more is read, never all of them."""
    found = list(rows[: count + 1])
    return found[:count], len(found) > count


def project_section(request: HttpRequest, project) -> str:
    """The project page's GPU part: its latest requests and pools, and the way to ask for more."""
    requests, more_requests = _latest(selectors.project_requests(project=project))
    pools, more_pools = _latest(selectors.project_pools(project=project))
    context = {
        "project": project,
        "requests": requests,
        "more_requests": more_requests,
        "pools": pools,
        "more_pools": more_pools,
        "positions": selectors.queue_positions(),
        "can_request": can_request_pools(user=request.user, tenant_id=project.tenant_id),
    }
    return render_to_string("pools/_project_pools.html", context, request=request)


# The id of the tenant page's GPU part: the region that refreshes itself, and where the home page links.
TENANT_SECTION_ID = "tenant-gpu-pools"


def tenant_section(request: HttpRequest, tenant) -> str:
    """The tenant page's GPU part: its quotas (where any is set), its live pools and its waiting requests,
    the latest few of each that the viewer may see, with why each request waits and where it stands in the
    queue; borrowed pools are marked, and a pool under notice says when it is released."""
    pools, more_pools = _latest(selectors.tenant_live_pools(user=request.user, tenant=tenant))
    requests, more_requests = _latest(selectors.tenant_waiting_requests(user=request.user, tenant=tenant))
    moving = bool(requests) or any(pool.state in selectors.MOVING_POOL_STATES for pool in pools)
    quotas = tenant_quotas(tenant.pk)
    context = {
        "tenant": tenant,
        "quotas": quotas,
        "borrowed": borrowed_pool_ids(pool.pk for pool in pools) if quotas else set(),
        "reclaiming": [pool for pool in pools if pool.state == PoolState.RECLAIMING],
        "pools": pools,
        "more_pools": more_pools,
        "requests": requests,
        "more_requests": more_requests,
        "positions": selectors.queue_positions() if requests else {},
        "latest": PROJECT_PAGE_LATEST,
        "section_id": TENANT_SECTION_ID,
        "refresh": refresh_while(moving),
    }
    return render_to_string("pools/_tenant_pools.html", context, request=request)


def tenant_figures(user, tenants) -> dict[int, list[shell.Figure]]:
    """The home page's figures of each tenant: live pools and waiting requests, in one query for all."""
    counts = selectors.tenant_counts(user=user, tenant_ids=[tenant.pk for tenant in tenants])
    figures = {}
    for tenant in tenants:
        pools, waiting = counts.get(tenant.pk, (0, 0))
        listed = reverse("tenant", kwargs={"slug": tenant.slug}) + "#" + TENANT_SECTION_ID  # both are there
        figures[tenant.pk] = [
            shell.Figure(ngettext("live pool", "live pools", pools), pools, listed),
            shell.Figure(ngettext("request waiting", "requests waiting", waiting), waiting, listed),
        ]
    return figures
