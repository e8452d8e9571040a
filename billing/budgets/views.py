"""Budgets on pages: a tenant's budgets page (its admins set and remove them), and the budget parts of the
tenant's and a project's pages, each budget beside the month's projection and what was spent to date."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods, require_POST

from billing.budgets import selectors, services
from billing.budgets.standing import months
from billing.conf import settings
from billing.models import MONEY
from billing.selectors import this_month
from portal import selectors as tenancy
from portal.errors import PortalError
from portal.models import Project, Tenant
from portal.permissions import is_tenant_admin

TENANT_WIDE = ""  # the form's choice for the tenant's own budget


class BudgetForm(forms.Form):
    project = forms.ChoiceField(label=gettext_lazy("For"), required=False)
    month_limit = forms.DecimalField(
        label=gettext_lazy("Monthly limit"),
        max_digits=MONEY["max_digits"],
        decimal_places=MONEY["decimal_places"],
        min_value=Decimal(0),
    )
    hard = forms.BooleanField(
        label=gettext_lazy("Hard budget"),
        required=False,
        help_text=gettext_lazy(
            "Requests that would take the projection past it wait for an approver's override."
        ),
    )

    def __init__(self, *args, tenant: Tenant, **kwargs):
        super().__init__(*args, **kwargs)
        choices = [(TENANT_WIDE, _("the whole tenant"))]
        choices += [(p.slug, p.name) for p in tenant.projects.order_by("name", "pk")]
        self.fields["project"].choices = choices


def _project(tenant: Tenant, slug: str) -> Project | None:
    return tenant.projects.filter(slug=slug).first() if slug else None


def _page(request: HttpRequest, tenant: Tenant, form: BudgetForm, status: int = 200) -> HttpResponse:
    context = {
        "tenant": tenant,
        "rows": months(selectors.tenant_budgets(tenant=tenant)),
        "form": form,
        "may_change": is_tenant_admin(user=request.user, tenant_id=tenant.pk),
        "currency": settings.BILLING_CURRENCY,
        "month": this_month(),
    }
    return render(request, "billing/budgets.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def tenant_budgets(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    """The tenant's budgets with the month's projection; its admins set one here (the tenant's or a
    project's, which replaces the one it had)."""
    tenant = tenancy.visible_tenant(user=request.user, slug=tenant_slug)
    if not selectors.may_see_budgets(user=request.user, tenant=tenant):
        return render(request, "billing/budgets_forbidden.html", {"tenant": tenant}, status=403)
    if request.method == "GET":
        return _page(request, tenant, BudgetForm(tenant=tenant))
    form = BudgetForm(request.POST, tenant=tenant)
    if not form.is_valid():
        return _page(request, tenant, form, status=400)
    data = form.cleaned_data
    try:
        services.set_budget(
            actor=request.user,
            tenant=tenant,
            project=_project(tenant, data["project"]),
            month_limit=data["month_limit"],
            currency=settings.BILLING_CURRENCY,
            hard=data["hard"],
        )
    except PortalError as error:
        form.add_error(error.field if error.field in form.fields else None, error.message)
        return _page(request, tenant, form, status=error.status_code)
    messages.success(request, _("Budget set."))
    return redirect("tenant-budgets", tenant_slug=tenant.slug)


@login_required
@require_POST
def tenant_budget_remove(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    tenant = tenancy.visible_tenant(user=request.user, slug=tenant_slug)
    project = _project(tenant, request.POST.get("project", ""))
    try:
        services.remove_budget(actor=request.user, tenant=tenant, project=project)
    except PortalError as error:
        return render(
            request,
            "refused.html",
            {"status": error.status_code, "reason": error.message},
            status=error.status_code,
        )
    messages.success(request, _("Budget removed."))
    return redirect("tenant-budgets", tenant_slug=tenant.slug)


def _section(request: HttpRequest, tenant: Tenant, budgets) -> str:
    rows = months(budgets)
    may_change = is_tenant_admin(user=request.user, tenant_id=tenant.pk)
    if not rows and not may_change:
        return ""
    context = {"tenant": tenant, "rows": rows, "may_change": may_change, "month": this_month()}
    return render_to_string("billing/_budgets.html", context, request=request)


def tenant_section(request: HttpRequest, tenant: Tenant) -> str:
    """The tenant's budgets (its own and its projects') against the month's projection."""
    return _section(request, tenant, selectors.tenant_budgets(tenant=tenant))


def project_section(request: HttpRequest, project: Project) -> str:
    """The budgets a request of the project counts against: its tenant's and its own."""
    return _section(request, project.tenant, selectors.project_budgets(project=project))
