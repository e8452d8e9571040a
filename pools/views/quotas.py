"""The quotas page of operators and approvers (/capacity/quotas/): guarantees against the capacity in service
per GPU group and model, who is short where a drain or fault made them too many, the requests within a
guarantee that would not fit even were every borrowed pool released; every tenant's quota rows (paged); a
form that creates or replaces one row, and each tenant's approval by policy, both through
pools/services/quotas.py. Anyone without the capacity permission gets 404; a change by anyone else but
operators and approvers is refused by the service (403)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_POST

from pools.apps import SET_QUOTAS, VIEW_CAPACITY
from pools.models import GpuGroup, PoolRequest, TenantPolicy
from pools.placement.admission import NOT_EVEN_RECLAIMED
from pools.selectors import fleet_figures
from pools.selectors.quotas import guarantees_against_capacity, quota_rows, shown_ledger
from pools.services.quotas import UNSET, set_auto_approve, set_quota
from portal.errors import PortalError
from portal.models import Project, Tenant
from portal.permissions import require_staff, staff_may

ROWS_PER_PAGE = 50


class QuotaForm(forms.Form):
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("name"), to_field_name="slug", label=gettext_lazy("Tenant")
    )
    project = forms.SlugField(
        required=False,
        label=gettext_lazy("Project"),
        help_text=gettext_lazy("Blank: the tenant's own quota. A project's is a limit inside the tenant's."),
    )
    group = forms.ChoiceField(required=False, label=gettext_lazy("GPU group"))
    gpu_model = forms.ChoiceField(label=gettext_lazy("GPU model"))
    guaranteed = forms.IntegerField(
        min_value=0, initial=0, required=False, label=gettext_lazy("Guaranteed compute slices")
    )
    limit = forms.IntegerField(
        min_value=0,
        required=False,
        label=gettext_lazy("Limit in compute slices"),
        help_text=gettext_lazy("Blank: the guarantee (no borrowing)."),
    )
    no_limit = forms.BooleanField(required=False, label=gettext_lazy("No limit: borrow whatever is idle"))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        groups = sorted(set(GpuGroup.objects.values_list("name", flat=True)))
        self.fields["group"].choices = [("", _("none (requests without a workload type)"))] + [
            (g, g) for g in groups
        ]
        # The models of the fleet's present GPUs: its figures have them, kept per capacity version.
        models = sorted(fleet_figures(by=lambda where: where.model))
        self.fields["gpu_model"].choices = [(m, m) for m in models]


@login_required
@require_GET
def quotas(request: HttpRequest) -> HttpResponse:
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    return _page(request, QuotaForm())


def _page(request: HttpRequest, form: QuotaForm, status: int = 200) -> HttpResponse:
    auto = set(
        TenantPolicy.objects.filter(auto_approve_within_guarantee=True).values_list("tenant_id", flat=True)
    )
    books = shown_ledger()  # every tenant's: read once for both tables
    context = {
        "guarantees": guarantees_against_capacity(books=books[0]),
        "not_even": PoolRequest.objects.waiting()
        .filter(waiting_reason_data__template=NOT_EVEN_RECLAIMED)
        .count(),
        "rows": Paginator(quota_rows(books=books), ROWS_PER_PAGE).get_page(request.GET.get("page")),
        "tenants": [(tenant, tenant.pk in auto) for tenant in Tenant.objects.order_by("name")],
        "form": form,
        "may_set": staff_may(user=request.user, permission=SET_QUOTAS),
    }
    return render(request, "pools/quotas.html", context, status=status)


@login_required
@require_POST
def quota_set(request: HttpRequest) -> HttpResponse:
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    form = QuotaForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    tenant, project = data["tenant"], None
    if data["project"]:
        project = Project.objects.filter(tenant=tenant, slug=data["project"]).first()
        if project is None:
            form.add_error(
                "project",
                _("Tenant %(tenant)s has no project %(project)s.")
                % {"tenant": tenant.slug, "project": data["project"]},
            )
            return _page(request, form, status=400)
    limit = None if data["no_limit"] else (UNSET if data["limit"] is None else data["limit"])
    try:
        set_quota(
            actor=request.user,
            tenant=tenant,
            project=project,
            group=data["group"],
            gpu_model=data["gpu_model"],
            guaranteed=data["guaranteed"] or 0,
            limit=limit,
        )
    except PortalError as error:
        form.add_error(None, error.message)
        return _page(request, form, status=error.status_code)
    messages.success(request, _("The quota of %(owner)s is set.") % {"owner": project or tenant.name})
    return redirect("capacity-quotas")


@login_required
@require_POST
def auto_approve(request: HttpRequest, slug: str) -> HttpResponse:
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    tenant = get_object_or_404(Tenant, slug=slug)
    on = request.POST.get("on") == "1"
    try:
        set_auto_approve(actor=request.user, tenant=tenant, on=on)
    except PortalError as error:
        messages.error(request, error.message)
        return redirect("capacity-quotas")
    messages.success(
        request,
        (
            _("%(tenant)s: requests within the guarantee are approved by the policy.")
            if on
            else _("%(tenant)s: every request goes to the approvers.")
        )
        % {"tenant": tenant.name},
    )
    return redirect("capacity-quotas")
