"""Billing pages: metering's state for operators and finance."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.timesince import timesince

from billing import metering, services
from billing.models import MeteredPeriod
from portal.permissions import staff_may

PERIODS_PER_PAGE = 50


@login_required
def metering_status(request: HttpRequest) -> HttpResponse:
    """How far metering has come: its lag, the next period it will meter, the periods it metered."""
    if not staff_may(user=request.user, permission="billing.view_meteredperiod"):
        raise Http404  # tenants do not learn that the page exists
    first = services.first_unmetered()
    periods = Paginator(MeteredPeriod.objects.order_by("-start"), PERIODS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    now = timezone.now()
    lag = services.metering_lag(now=now)
    context = {
        "lag": timesince(now - lag, now) if lag else "",  # in the reader's language
        "next_period": None if first is None else metering.moment(first),
        "page": periods,
    }
    return render(request, "billing/metering.html", context)
