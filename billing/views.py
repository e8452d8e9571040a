"""Billing pages: metering's state for operators and finance; finance's months and invoices."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from csp.decorators import csp_replace
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.timesince import timesince
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_POST

from billing import charts, exports, finance, invoices, invoicing, metering, selectors, services
from billing.conf import settings
from billing.models import CreditNote, Invoice, InvoiceState, MeteredPeriod
from portal.charts import CHART_POLICY
from portal.errors import Conflict, InvalidInput, PortalError
from portal.models import Tenant
from portal.permissions import require_staff, staff_may


class CreditForm(forms.Form):
    amount = forms.DecimalField(
        label=gettext_lazy("Net amount"),
        max_digits=14,
        decimal_places=4,
        help_text=gettext_lazy("Before tax; the invoice's tax rate is added."),
    )
    reason = forms.CharField(
        label=gettext_lazy("Why"), max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )


class VoidForm(forms.Form):
    reason = forms.CharField(
        label=gettext_lazy("Why it is void"),
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=gettext_lazy("Kept with the invoice; its number stays taken."),
    )


PERIODS_PER_PAGE = 50


@login_required
def metering_status(request: HttpRequest) -> HttpResponse:
    """How far metering has come: its lag, the next period it will meter, the periods it metered."""
    require_staff(user=request.user, permission="billing.view_meteredperiod")
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


# --- Finance's workspace --------------------------------------------------------------------------

INVOICES_PER_PAGE = 50
MONTH = "%Y-%m"


def _month(text: str) -> date:
    try:
        year, month = invoicing.parse_month(text)
    except invoicing.BadMonth as error:
        raise Http404 from error
    return date(year, month, 1)


@login_required
def finance_home(request: HttpRequest) -> HttpResponse:
    """The last month that has ended: the one finance closes and issues."""
    require_staff(user=request.user, permission="billing.view_invoice")
    return redirect("billing-month", month=f"{finance.shift(selectors.this_month(), -1):{MONTH}}")


@login_required
def finance_month(request: HttpRequest, month: str) -> HttpResponse:
    require_staff(user=request.user, permission="billing.view_invoice")
    first, now = _month(month), timezone.now()
    following = finance.shift(first, 1)
    state = request.GET.get("state", "")
    if state not in {"", "overdue", *InvoiceState.values}:
        state = ""
    page = Paginator(finance.month_invoices(first, state=state, now=now), INVOICES_PER_PAGE).get_page(
        request.GET.get("page")
    )
    try:
        invoices.month_to_close(month, now=now)
        closable, not_closable = True, ""
    except PortalError as error:
        closable, not_closable = False, error.message
    context = {
        "month": first,
        "previous": finance.shift(first, -1),
        "next": following if following <= selectors.this_month(now) else None,
        "totals": finance.month_totals(first, now=now),
        "rows": finance.rows(list(page.object_list), first, now=now),
        "page": page,
        "state": state,
        "states": [("", _("all")), *InvoiceState.choices, ("overdue", _("overdue"))],
        "closable": closable,
        "not_closable": not_closable,
        "currency": settings.BILLING_CURRENCY,
        "payment_days": settings.BILLING_PAYMENT_DAYS,
        "may_issue": staff_may(user=request.user, permission="billing.issue_invoice"),
        "may_export": staff_may(user=request.user, permission="billing.export_invoice"),
    }
    context["drafts"] = next(row.count for row in context["totals"].states if row.state == InvoiceState.DRAFT)
    return render(request, "billing/finance_month.html", context)


@login_required
@csp_replace(CHART_POLICY)
def finance_chart(request: HttpRequest, month: str) -> HttpResponse:
    """The twelve months up to this one, as an SVG image (its styles are inline, its scripts none)."""
    require_staff(user=request.user, permission="billing.view_invoice")
    svg = charts.month_totals_svg(finance.history(_month(month)), currency=settings.BILLING_CURRENCY)
    response = HttpResponse(svg, content_type="image/svg+xml")
    response["Cache-Control"] = "private, max-age=60"
    return response


@login_required
def finance_close(request: HttpRequest, month: str) -> HttpResponse:
    """GET: what closing the month would produce, tenant by tenant. POST: close it."""
    require_staff(user=request.user, permission="billing.issue_invoice")
    first = _month(month)
    if request.method == "POST":
        closing = invoices.close_month(month, by=request.user)  # a refusal is answered by RefusalMiddleware
        messages.success(
            request,
            _("%(month)s closed: %(created)d draft(s) created, %(rebuilt)d rebuilt, %(kept)d left as issued.")
            % {
                "month": month,
                "created": len(closing.created),
                "rebuilt": len(closing.rebuilt),
                "kept": len(closing.kept),
            },
        )
        return redirect("billing-month", month=month)
    try:
        drafts = invoices.preview_month(month)[1]
    except PortalError as error:
        context = {"month": first, "refusal": error.message}
        return render(request, "billing/finance_close.html", context, status=error.status_code)
    page = Paginator(drafts, INVOICES_PER_PAGE).get_page(request.GET.get("page"))
    tenants = Tenant.objects.in_bulk([draft.tenant_id for draft in page.object_list])
    context = {
        "month": first,
        "page": page,
        "entries": [(draft, tenants[draft.tenant_id]) for draft in page.object_list],
        "counts": {
            action: sum(1 for draft in drafts if draft.action == action)
            for action in ("create", "rebuild", "keep")
        },
        "total": sum((draft.totals.total for draft in drafts if draft.action != "keep"), Decimal(0)),
        "currency": settings.BILLING_CURRENCY,
    }
    return render(request, "billing/finance_close.html", context)


@login_required
@require_POST
def finance_issue(request: HttpRequest, month: str) -> HttpResponse:
    """Issue the chosen drafts of the month (or all of them), all or none: numbers follow tenant order."""
    require_staff(user=request.user, permission="billing.issue_invoice")
    first = _month(month)
    drafts = Invoice.objects.filter(month=first, state=InvoiceState.DRAFT)
    if request.POST.get("all") != "1":
        try:
            chosen = {int(value) for value in request.POST.getlist("invoice")}
        except ValueError as error:
            raise InvalidInput(_("Choose invoices from the list.")) from error
        if not chosen:
            raise InvalidInput(_("Choose the drafts to issue."))
        found = set(drafts.filter(pk__in=chosen).values_list("pk", flat=True))
        if found != chosen:
            raise Conflict(
                _("Only drafts of %(month)s can be issued here; %(count)d of those chosen are not (now).")
                % {"month": month, "count": len(chosen - found)}
            )
        drafts = drafts.filter(pk__in=chosen)
    with transaction.atomic():
        issued = [
            invoices.issue(invoice_id=pk, by=request.user)
            for pk in drafts.order_by("tenant__name", "tenant_id").values_list("pk", flat=True)
        ]
    if issued:
        messages.success(
            request,
            ngettext(
                "%(count)d invoice issued: %(numbers)s.",
                "%(count)d invoices issued: %(numbers)s.",
                len(issued),
            )
            % {"count": len(issued), "numbers": ", ".join(invoice.number for invoice in issued[:20])},
        )
    else:
        messages.info(request, _("No draft left to issue."))
    return redirect("billing-month", month=month)


@login_required
def finance_month_export(request: HttpRequest, month: str, kind: str) -> HttpResponse:
    require_staff(user=request.user, permission="billing.export_invoice")
    if kind not in exports.MONTH_FORMATS:
        raise Http404
    return exports.download(exports.export_month(_month(month), kind))


def _finance_invoice(request: HttpRequest, pk: int) -> Invoice:
    return get_object_or_404(Invoice.objects.select_related("tenant", "tenant__billing_profile"), pk=pk)


@login_required
def finance_invoice(
    request: HttpRequest,
    pk: int,
    *,
    form: VoidForm | None = None,
    credit_form: CreditForm | None = None,
    status: int = 200,
) -> HttpResponse:
    require_staff(user=request.user, permission="billing.view_invoice")
    invoice = _finance_invoice(request, pk)
    now = timezone.now()
    context = {
        "invoice": invoice,
        "profile": getattr(invoice.tenant, "billing_profile", None),
        "lines": invoice.lines.filter(kind="usage").select_related("project").order_by("project__slug", "pk"),
        "overdue": finance.is_overdue(invoice, now),
        "due_at": finance.due_at(invoice),
        "void_form": form or VoidForm(),
        "credit_form": credit_form or CreditForm(),
        "credit_notes": invoice.credit_notes.order_by("issued_at", "pk"),
        "credited": invoices.credited(invoice),
        "may_credit": staff_may(user=request.user, permission="billing.add_creditnote"),
        "formats": list(exports.FORMATS),
        "may_issue": staff_may(user=request.user, permission="billing.issue_invoice"),
        "may_export": staff_may(user=request.user, permission="billing.export_invoice"),
    }
    return render(request, "billing/finance_invoice.html", context, status=status)


@login_required
@require_POST
def finance_invoice_act(request: HttpRequest, pk: int, act: str) -> HttpResponse:
    """Issue, mark paid or void one invoice; a refusal is shown on the invoice's page."""
    require_staff(user=request.user, permission="billing.issue_invoice")
    invoice = _finance_invoice(request, pk)
    if act == "void":
        form = VoidForm(request.POST)
        if not form.is_valid():
            return finance_invoice(request, pk, form=form, status=400)
        done = invoices.void(invoice_id=invoice.pk, reason=form.cleaned_data["reason"], by=request.user)
        messages.success(request, _("Invoice %(invoice)s is void.") % {"invoice": done})
    elif act == "credit":
        return _credit(request, invoice)
    elif act == "issue":
        done = invoices.issue(invoice_id=invoice.pk, by=request.user)
        messages.success(request, _("Invoice %(invoice)s issued.") % {"invoice": done})
    elif act == "paid":
        done = invoices.mark_paid(invoice_id=invoice.pk, by=request.user)
        messages.success(request, _("Invoice %(invoice)s marked paid.") % {"invoice": done})
    else:
        raise Http404
    return redirect("billing-invoice", pk=invoice.pk)


def _credit(request: HttpRequest, invoice: Invoice) -> HttpResponse:
    require_staff(user=request.user, permission="billing.add_creditnote")
    form = CreditForm(request.POST)
    if form.is_valid():
        try:
            note = invoices.credit(
                invoice_id=invoice.pk,
                amount=form.cleaned_data["amount"],
                reason=form.cleaned_data["reason"],
                by=request.user,
            )
        except PortalError as error:
            form.add_error(error.field if error.field in form.fields else None, error.message)
        else:
            messages.success(request, _("Credit note %(note)s made.") % {"note": note.number})
            return redirect("billing-invoice", pk=invoice.pk)
    return finance_invoice(request, invoice.pk, credit_form=form, status=400)


@login_required
def credit_note_pdf(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission="billing.export_invoice")
    note = get_object_or_404(CreditNote.objects.select_related("invoice__tenant"), pk=pk)
    return exports.download(exports.export_credit_note(note))
