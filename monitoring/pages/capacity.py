"""Monitoring's part of the operators' capacity pages (`AppPlugin.capacity_sections`): for what the page
shows, the alerts firing there with a button to acknowledge each (back to the page), compute slices
allocated against used (kept a few seconds: monitoring/selectors/kept.py), and on a node page each GPU's
newest figures. Shown to staff holding monitoring's view permissions (alerts: `monitoring.view_alert`;
figures: `monitoring.view_latest`); nothing otherwise."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils import timezone

from monitoring.selectors import FRESH
from monitoring.selectors.capacity import firing_alerts, gpu_figures
from monitoring.selectors.kept import kept_scope_usage
from portal.permissions import staff_may
from portal.shell import CapacityScope

ALERTS_PER_PAGE = 10
ALERTS_PAGE = "alerts_page"  # its own parameter: the capacity page pages its nodes with "page"


def section(request: HttpRequest, scope: CapacityScope) -> str:
    may_alerts = staff_may(user=request.user, permission="monitoring.view_alert")
    may_figures = staff_may(user=request.user, permission="monitoring.view_latest")
    if not (may_alerts or may_figures):
        return ""
    now = timezone.now()
    context = {
        "scope": scope,
        "alerts": None,
        "usage": None,
        "figures": [],
        "alerts_page_parameter": ALERTS_PAGE,
        "fresh_minutes": int(FRESH.total_seconds() // 60),
    }
    if may_alerts:
        found = firing_alerts(scope=scope)
        context["alerts"] = Paginator(found, ALERTS_PER_PAGE).get_page(request.GET.get(ALERTS_PAGE))
        context["may_acknowledge"] = staff_may(user=request.user, permission="monitoring.change_alert")
    if may_figures:
        context["usage"] = kept_scope_usage(scope=scope).value
        if scope.gpu_ids:
            context["figures"] = gpu_figures(gpu_ids=list(scope.gpu_ids), now=now)
    return render_to_string("monitoring/_capacity_section.html", context, request=request)
