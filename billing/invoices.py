"""Invoices' state changes: closing a month into drafts, issuing (gap-free numbers), paid, void.

A month is closed in the billing time zone once it has ended and metering has reached its end.
Closing again rebuilds the drafts from the usage records and leaves issued invoices alone, so it
is safe to repeat. An issued invoice never changes; the database refuses it whatever the code does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from billing import invoicing, metering
from billing.models import BillingProfile, Invoice, InvoiceLine, InvoiceSequence, InvoiceState, UsageRecord
from billing.services import first_unmetered
from portal.errors import Conflict, InvalidInput


@dataclass
class Closing:
    """What closing a month did (or, for a preview, would do)."""

    month: date
    created: list[Invoice] = field(default_factory=list)
    rebuilt: list[Invoice] = field(default_factory=list)
    kept: list[Invoice] = field(default_factory=list)  # issued, paid: never touched

    def summary(self) -> str:
        return (
            f"{self.month:%Y-%m}: {len(self.created)} draft(s) created, {len(self.rebuilt)} rebuilt, "
            f"{len(self.kept)} issued left as they are"
        )


def month_to_close(text: str, *, now: datetime | None = None) -> tuple[date, datetime, datetime]:
    """The month's first day and its bounds (UTC), refused when it has not ended or is not metered."""
    now = now or timezone.now()
    try:
        year, month = invoicing.parse_month(text)
    except invoicing.BadMonth as error:
        raise InvalidInput(str(error)) from error
    start, end = invoicing.month_span(year, month, settings.BILLING_TIME_ZONE)
    local_end = timezone.localtime(end, ZoneInfo(settings.BILLING_TIME_ZONE))
    if end > now:
        raise InvalidInput(
            _("%(month)s has not ended yet: it can be closed from %(end)s (%(zone)s).")
            % {"month": text, "end": local_end.strftime("%Y-%m-%d %H:%M"), "zone": settings.BILLING_TIME_ZONE}
        )
    pending = first_unmetered()
    if pending is not None and pending < metering.whole_seconds(end):
        raise InvalidInput(
            _("Metering has reached %(reached)s UTC only; run manage.py meter, then close %(month)s.")
            % {"reached": metering.moment(pending).strftime("%Y-%m-%d %H:%M"), "month": text}
        )
    return date(year, month, 1), start, end


def tax_rate_of(tenant_id: int) -> Decimal:
    rate = BillingProfile.objects.filter(tenant_id=tenant_id).values_list("tax_rate", flat=True).first()
    return Decimal(settings.BILLING_TAX_RATE) if rate is None else rate


def month_usage(start: datetime, end: datetime) -> dict[int, list[invoicing.Usage]]:
    """Tenant → its usage of the month, summed per project, spec and unit price."""
    rows = (
        UsageRecord.objects.filter(period_start__gte=start, period_start__lt=end)
        .values("pool__project__tenant_id", "pool__project_id", "gpu_model", "profile", "unit_price")
        .annotate(seconds=Sum("seconds"))
        .order_by()
    )
    found: dict[int, list[invoicing.Usage]] = defaultdict(list)
    for row in rows:
        found[row["pool__project__tenant_id"]].append(
            invoicing.Usage(
                row["pool__project_id"], row["gpu_model"], row["profile"], row["unit_price"], row["seconds"]
            )
        )
    return found


def close_month(text: str, *, now: datetime | None = None) -> Closing:
    """Build (or rebuild) the draft invoice of every tenant that used GPUs in the month."""
    month, start, end = month_to_close(text, now=now)
    closing = Closing(month)
    currency = settings.BILLING_CURRENCY
    for tenant_id, usage in sorted(month_usage(start, end).items()):
        with transaction.atomic():
            invoice = (
                Invoice.objects.select_for_update()
                .filter(tenant_id=tenant_id, month=month)
                .exclude(state=InvoiceState.VOID)
                .first()
            )
            if invoice is not None and invoice.state != InvoiceState.DRAFT:
                closing.kept.append(invoice)
                continue
            rate = tax_rate_of(tenant_id)
            totals = invoicing.invoice_lines(usage, tax_rate=rate, currency=currency)
            fields = {
                "currency": currency,
                "tax_rate": rate,
                "subtotal": totals.subtotal,
                "tax": totals.tax,
                "total": totals.total,
            }
            if invoice is None:
                invoice = Invoice.objects.create(tenant_id=tenant_id, month=month, **fields)
                closing.created.append(invoice)
            else:
                invoice.lines.all().delete()
                Invoice.objects.filter(pk=invoice.pk).update(**fields)
                closing.rebuilt.append(invoice)
            InvoiceLine.objects.bulk_create(
                InvoiceLine(
                    invoice=invoice,
                    kind=line.kind,
                    project_id=line.project_id,
                    gpu_model=line.gpu_model,
                    profile=line.profile,
                    seconds=line.seconds,
                    unit_price=line.unit_price,
                    amount=line.amount,
                )
                for line in totals.lines
            )
    return closing


def issue(*, invoice_id: int, at: datetime | None = None) -> Invoice:
    """Give a draft its number, the next of its year (in the billing time zone) with no gap."""
    at = at or timezone.now()
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.state != InvoiceState.DRAFT:
            raise Conflict(
                _("Invoice %(invoice)s is %(state)s already.")
                % {"invoice": invoice, "state": invoice.get_state_display()}
            )
        year = timezone.localtime(at, ZoneInfo(settings.BILLING_TIME_ZONE)).year
        InvoiceSequence.objects.get_or_create(year=year)
        sequence = InvoiceSequence.objects.select_for_update().get(year=year)
        sequence.last += 1
        sequence.save(update_fields=["last"])
        invoice.number = f"{year}-{sequence.last:05d}"
        invoice.state = InvoiceState.ISSUED
        invoice.issued_at = at
        invoice.save(update_fields=["number", "state", "issued_at"])
    return invoice


def mark_paid(*, invoice_id: int, at: datetime | None = None) -> Invoice:
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.state != InvoiceState.ISSUED:
            raise Conflict(
                _("Only an issued invoice can be marked paid; %(invoice)s is %(state)s.")
                % {"invoice": invoice, "state": invoice.get_state_display()}
            )
        invoice.state, invoice.paid_at = InvoiceState.PAID, at or timezone.now()
        invoice.save(update_fields=["state", "paid_at"])
    return invoice


def void(*, invoice_id: int, reason: str, at: datetime | None = None) -> Invoice:
    """Cancel a draft or an issued invoice, saying why; its number stays taken."""
    reason = reason.strip()
    if not reason:
        raise InvalidInput(_("Say why the invoice is void."), field="reason")
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.state not in (InvoiceState.DRAFT, InvoiceState.ISSUED):
            raise Conflict(
                _("Invoice %(invoice)s is %(state)s: it cannot be voided.")
                % {"invoice": invoice, "state": invoice.get_state_display()}
            )
        if invoice.state == InvoiceState.DRAFT:
            invoice.number = None
        invoice.state, invoice.voided_at, invoice.void_reason = (
            InvoiceState.VOID,
            at or timezone.now(),
            reason[:2000],
        )
        invoice.save(update_fields=["state", "voided_at", "void_reason"])
    return invoice
