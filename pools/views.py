"""Operator pages: the GPU dashboard (clusters → groups → nodes → GPUs with their MIG layouts)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from pools import mig, selectors


def _require_capacity_viewer(request: HttpRequest) -> None:
    user = request.user
    if not (user.is_staff and user.has_perm("pools.view_gpucapacity")):
        raise Http404  # tenants do not learn that the page exists


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    _require_capacity_viewer(request)
    summary = selectors.capacity_summary()
    totals = {
        "gpus": sum(s.gpus for s in summary),
        "compute_total": sum(s.compute_total for s in summary),
        "compute_allocated": sum(s.compute_allocated for s in summary),
        "compute_free": sum(s.compute_free for s in summary),
        "compute_stranded": sum(s.compute_stranded for s in summary),
    }
    context = {
        "clusters": selectors.dashboard(),
        "summary": summary,
        "totals": totals,
        "memory_slices": range(mig.MEMORY_SLICES),
    }
    return render(request, "pools/dashboard.html", context)
