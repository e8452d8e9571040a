"""Monitoring as a tenant sees it: its pool's own SM activity and memory over time, a section of the pool
page whose charts are served under the tenant's address, so that anyone outside the tenant gets 404."""

from __future__ import annotations

from csp.decorators import csp_replace
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from monitoring import charts, selectors
from pools.models import Pool
from portal.errors import InvalidInput

# The section shares the pool page's address with other sections: its range has a parameter of its own.
RANGE_PARAMETER = "usage_range"


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
    }
    return render_to_string("monitoring/_pool_usage.html", context, request=request)


@login_required
@require_GET
@csp_replace(charts.CHART_POLICY)
def pool_usage_chart(request: HttpRequest, tenant_slug: str, pk: int, metric: str) -> HttpResponse:
    """One of the pool's charts as SVG; a pool outside the user's tenants is 404, a bad range 400."""
    pool = selectors.visible_pool(user=request.user, tenant_slug=tenant_slug, pool_id=pk)
    if metric not in charts.TENANT_MEASURES:
        raise Http404
    try:
        chosen = charts.parse_range(request.GET.get("range"))
    except InvalidInput as error:
        return charts.refusal(error)
    return charts.svg_response(charts.pool_svg(pool, metric, chosen))
