"""Monitoring as a tenant sees it: its pool's own SM activity and memory over time, a section of the pool
page, and a small SM-activity chart of each live pool, a section of the tenant page; the charts are served
under the tenant's address, so that anyone outside the tenant gets 404."""

from __future__ import annotations

from csp.decorators import csp_replace
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from monitoring import selectors
from monitoring.pages import charts
from pools import selectors as pool_selectors
from pools.models import Pool
from portal.charts import CHART_POLICY
from portal.errors import InvalidInput
from portal.models import Tenant

# The section shares the pool page's address with other sections: its range has a parameter of its own.
RANGE_PARAMETER = "usage_range"
# The tenant page draws at most this many pools' charts, the newest live ones; its lists have the rest.
TENANT_CHARTS = 6
TENANT_RANGE = "24h"
TENANT_MEASURE = "sm_active_pct"


def pool_section(request: HttpRequest, pool: Pool) -> str:
    """The pool's SM activity and memory over a range chosen on the page; a range it does not know
    falls back to the default (the section cannot answer 400 for the whole page) and says so."""
    asked = request.GET.get(RANGE_PARAMETER)
    try:
        chosen, refused = charts.parse_range(asked), ""
    except InvalidInput as error:
        chosen, refused = charts.DEFAULT_RANGE, error.message
    context = {
        "pool": pool,
        "tenant_slug": pool.project.tenant.slug,
        "range": chosen,
        "refused": refused,
        "ranges": list(charts.RANGES),
        "measures": [(m, charts.MEASURES[m]) for m in charts.TENANT_MEASURES],
        "range_parameter": RANGE_PARAMETER,
        "shared": selectors.shares_gpus(pool=pool),
    }
    return render_to_string("monitoring/_pool_usage.html", context, request=request)


def tenant_section(request: HttpRequest, tenant: Tenant) -> str:
    """A small chart of each live pool's SM activity over the last day, the newest few that the viewer may
    see, each linking to its pool's page; nothing when no pool is live."""
    found = list(pool_selectors.tenant_live_pools(user=request.user, tenant=tenant)[: TENANT_CHARTS + 1])
    if not found:
        return ""
    context = {
        "tenant": tenant,
        "pools": found[:TENANT_CHARTS],
        "more": len(found) > TENANT_CHARTS,
        "shown": TENANT_CHARTS,
        "metric": TENANT_MEASURE,
        "measure": charts.MEASURES[TENANT_MEASURE],
        "range": TENANT_RANGE,
        "size": "small",
        "width": charts.SIZES["small"][0],
        "height": charts.SIZES["small"][1],
    }
    return render_to_string("monitoring/_tenant_usage.html", context, request=request)


@login_required
@require_GET
@csp_replace(CHART_POLICY)
def pool_usage_chart(request: HttpRequest, tenant_slug: str, pk: int, metric: str) -> HttpResponse:
    """One of the pool's charts as SVG; a pool outside the user's tenants is 404, a bad range 400."""
    pool = selectors.visible_pool(user=request.user, tenant_slug=tenant_slug, pool_id=pk)
    if metric not in charts.TENANT_MEASURES:
        raise Http404
    try:
        chosen = charts.parse_range(request.GET.get("range"))
        size = charts.parse_size(request.GET.get("size"))
    except InvalidInput as error:
        return charts.refusal(error)
    return charts.svg_response(charts.pool_svg(pool, metric, chosen, size))
