"""Pages of the GPU faults: the approvers' and operators' list (re-place a pool, clear a fault) and the
banner on a tenant's pool page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from monitoring.faults import services as faults
from monitoring.faults.audience import describe
from monitoring.models import GpuFault
from monitoring.selectors.faults import open_faults, pool_faults
from pools.models import Pool
from pools.services import replacement
from portal.errors import PortalError
from portal.permissions import require_any_staff, require_staff, staff_may

FAULTS_PER_PAGE = 20


def _may_approve(request: HttpRequest) -> bool:
    return staff_may(user=request.user, permission=faults.APPROVER_PERMISSION)


def _may_operate(request: HttpRequest) -> bool:
    return staff_may(user=request.user, permission=faults.OPERATOR_PERMISSION)


@login_required
def fault_list(request: HttpRequest) -> HttpResponse:
    require_any_staff(user=request.user, permissions=(faults.APPROVER_PERMISSION, faults.OPERATOR_PERMISSION))
    may_approve, may_operate = _may_approve(request), _may_operate(request)
    page = Paginator(
        GpuFault.objects.open().select_related("gpu__node__cluster", "cleared_by"), FAULTS_PER_PAGE
    ).get_page(request.GET.get("page"))
    context = {
        "faults": open_faults(list(page.object_list)),
        "page": page,
        "may_approve": may_approve,
        "may_operate": may_operate,
    }
    return render(request, "monitoring/faults.html", context)


@login_required
@require_POST
def pool_replace(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission=faults.APPROVER_PERMISSION)
    pool = get_object_or_404(Pool, pk=pk)
    try:
        replacement.replace(pool=pool, actor=request.user)
    except PortalError as error:
        messages.error(request, error.message)
    else:
        messages.success(
            request,
            _("Pool #%(id)s is re-placed; its new GPUs are being set up.") % {"id": pool.pk},
        )
    return redirect("monitoring-faults")


@login_required
@require_POST
def fault_clear(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission=faults.OPERATOR_PERMISSION)
    fault = get_object_or_404(GpuFault, pk=pk)
    try:
        fault = faults.clear_fault(fault=fault, user=request.user)
    except PortalError as error:
        messages.error(request, error.message)
    else:
        done = (
            _("The fault of %(gpu)s is cleared; the GPU takes work again.")
            if fault.drained_by_portal
            else _("The fault of %(gpu)s is cleared; the GPU stays drained, as it was before the fault.")
        )
        messages.success(request, done % {"gpu": fault.gpu})
    return redirect("monitoring-faults")


def pool_section(request: HttpRequest, pool: Pool) -> str:
    """A banner on the pool's page while the pool runs on a faulty GPU; nothing otherwise."""
    found = pool_faults(pool)
    if not found:
        return ""
    context = {"pool": pool, "faults": [(fault, describe(fault)) for fault in found]}
    return render_to_string("monitoring/_pool_faults.html", context, request=request)
