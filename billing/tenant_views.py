"""Billing as a tenant sees it: what its pools cost as it accrues (sections of the tenant, project and pool
pages, shown to every member) and its invoices (a page for its admins and finance)."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.utils import timezone

from billing import exports, selectors, spend
from billing.models import CreditNote
from pools.models import Pool
from portal import selectors as tenancy
from portal.models import Project, Tenant

SPEND_ROWS_PER_PAGE = 20
SPEND_PAGE = "spend_page"  # the sections share their page with others: their pager has its own parameter
INVOICES_PER_PAGE = 25


def _spend_context(request: HttpRequest, rows, found: dict[int, spend.Spend], now: datetime) -> dict:
    """A page of rows (pools or projects, by id in `found`), each with its figures, and the total."""
    page = Paginator(rows, SPEND_ROWS_PER_PAGE).get_page(request.GET.get(SPEND_PAGE))
    return {
        "page": page,
        "rows": [(row, spend.figures(found[row.pk])) for row in page],
        "total": spend.figures(spend.total(found.values())),
        "month": selectors.this_month(now),
        "now": now,
        "page_parameter": SPEND_PAGE,
    }


def project_section(request: HttpRequest, project: Project) -> str:
    """This month's cost of the project's pools, to date and projected to the month's end."""
    now = timezone.now()
    found = spend.pool_spend(pools=Pool.objects.filter(project=project), now=now)
    rows = Pool.objects.filter(pk__in=list(found)).order_by("-reserved_at", "-pk")
    context = {"project": project, **_spend_context(request, rows, found, now)}
    return render_to_string("billing/_project_spend.html", context, request=request)


def _tenant_spend_context(request: HttpRequest, tenant: Tenant) -> dict:
    """This month's cost per project of the tenant, and its total: what its own page and an approver see."""
    now = timezone.now()
    per_pool = spend.pool_spend(pools=Pool.objects.filter(project__tenant=tenant), now=now)
    project_of = dict(Pool.objects.filter(pk__in=list(per_pool)).values_list("pk", "project_id"))
    found = spend.by_project(per_pool, project_of)
    rows = Project.objects.filter(pk__in=list(found)).order_by("name", "pk")
    return {"tenant": tenant, **_spend_context(request, rows, found, now)}


def tenant_section(request: HttpRequest, tenant: Tenant) -> str:
    """This month's cost per project of the tenant: to date, the hourly rate now, the projection."""
    context = _tenant_spend_context(request, tenant)
    return render_to_string("billing/_tenant_spend.html", context, request=request)


def approval_section(request: HttpRequest, tenant: Tenant) -> str:
    """On an approver's page of one of the tenant's requests: what the tenant spends this month, to date
    and projected to the month's end, by the same figures as the tenant's own page."""
    context = {**_tenant_spend_context(request, tenant), "for_approver": True}
    return render_to_string("billing/_tenant_spend.html", context, request=request)


def pool_section(request: HttpRequest, pool: Pool) -> str:
    """The pool's cost: per hour now, this month to date, since reserved, and projected to the month's end."""
    now = timezone.now()
    found = spend.pool_spend(pools=Pool.objects.filter(pk=pool.pk), now=now, ever=True)
    context = {
        "pool": pool,
        "figures": spend.figures(found.get(pool.pk, spend.Spend())),
        "month": selectors.this_month(now),
        "now": now,
    }
    return render_to_string("billing/_pool_spend.html", context, request=request)


def _forbidden(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    return render(request, "billing/invoices_forbidden.html", {"tenant": tenant}, status=403)


@login_required
def tenant_invoices(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    """The tenant's issued, paid and void invoices, newest month first, each downloadable."""
    tenant = tenancy.visible_tenant(user=request.user, slug=tenant_slug)
    if not selectors.may_see_invoices(user=request.user, tenant=tenant):
        return _forbidden(request, tenant)
    invoices = selectors.tenant_invoices(user=request.user, tenant=tenant).prefetch_related(
        Prefetch("credit_notes", queryset=CreditNote.objects.order_by("issued_at", "pk"))
    )
    page = Paginator(invoices, INVOICES_PER_PAGE).get_page(request.GET.get("page"))
    context = {"tenant": tenant, "page": page, "formats": list(exports.FORMATS)}
    return render(request, "billing/tenant_invoices.html", context)


@login_required
def tenant_invoice_download(request: HttpRequest, tenant_slug: str, pk: int, kind: str) -> HttpResponse:
    """One invoice as a file, the same bytes as the API's export."""
    tenant = tenancy.visible_tenant(user=request.user, slug=tenant_slug)
    if not selectors.may_see_invoices(user=request.user, tenant=tenant):
        return _forbidden(request, tenant)
    if kind not in exports.FORMATS:
        raise Http404  # no such file
    invoice = get_object_or_404(selectors.tenant_invoices(user=request.user, tenant=tenant), pk=pk)
    return exports.download(exports.export(invoice, kind))


@login_required
def tenant_credit_note_pdf(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    """A credit note of one of the tenant's invoices, as the PDF its billing contact was sent."""
    tenant = tenancy.visible_tenant(user=request.user, slug=tenant_slug)
    if not selectors.may_see_invoices(user=request.user, tenant=tenant):
        return _forbidden(request, tenant)
    invoices = selectors.tenant_invoices(user=request.user, tenant=tenant)
    note = get_object_or_404(
        CreditNote.objects.select_related("invoice__tenant"), pk=pk, invoice__in=invoices
    )
    return exports.download(exports.export_credit_note(note))
