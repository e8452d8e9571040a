"""Closing a month: the draft invoice of every tenant that used GPUs in it, built (or built again) from
its usage records.

A month is closed in the billing time zone once it has ended and metering has reached its end.
Closing again rebuilds the drafts and leaves issued invoices alone, so it is safe to repeat.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from billing import invoicing, metering
from billing.conf import settings
from billing.invoices.trail import DRAFTED, MONTH_CLOSED, REBUILT, record
from billing.models import BillingProfile, Invoice, InvoiceLine, InvoiceState, UsageRecord
from billing.services import first_unmetered
from portal import audit
from portal.errors import InvalidInput


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


@dataclass(frozen=True)
class Draft:
    """What closing will make of one tenant's month: its lines and totals, and the invoice it has now."""

    tenant_id: int
    tax_rate: Decimal
    totals: invoicing.Totals
    invoice: Invoice | None  # the month's invoice that is not void, if any

    @property
    def action(self) -> str:
        """`create`, `rebuild` (a draft is built again) or `keep` (issued or paid: never touched)."""
        if self.invoice is None:
            return "create"
        return "rebuild" if self.invoice.state == InvoiceState.DRAFT else "keep"


def draft_of(tenant_id: int, usage: list[invoicing.Usage], invoice: Invoice | None) -> Draft:
    rate = tax_rate_of(tenant_id)
    totals = invoicing.invoice_lines(usage, tax_rate=rate, currency=settings.BILLING_CURRENCY)
    return Draft(tenant_id, rate, totals, invoice)


def preview_month(text: str, *, now: datetime | None = None) -> tuple[date, list[Draft]]:
    """What `close_month` would do, tenant by tenant, writing nothing; refused as closing would be."""
    month, start, end = month_to_close(text, now=now)
    usage = month_usage(start, end)
    current = {
        invoice.tenant_id: invoice
        for invoice in Invoice.objects.filter(month=month, tenant_id__in=list(usage)).exclude(
            state=InvoiceState.VOID
        )
    }
    return month, [draft_of(tenant, usage[tenant], current.get(tenant)) for tenant in sorted(usage)]


def close_month(text: str, *, now: datetime | None = None, by=None) -> Closing:
    """Build (or rebuild) the draft invoice of every tenant that used GPUs in the month."""
    month, start, end = month_to_close(text, now=now)
    closing = Closing(month)
    for tenant_id, usage in sorted(month_usage(start, end).items()):
        with transaction.atomic():
            invoice = (
                Invoice.objects.select_for_update()
                .filter(tenant_id=tenant_id, month=month)
                .exclude(state=InvoiceState.VOID)
                .first()
            )
            draft = draft_of(tenant_id, usage, invoice)
            if draft.action == "keep":
                closing.kept.append(invoice)
                continue
            totals = draft.totals
            fields = {
                "currency": settings.BILLING_CURRENCY,
                "tax_rate": draft.tax_rate,
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
            record(
                "invoice.drafted" if invoice in closing.created else "invoice.rebuilt",
                DRAFTED if invoice in closing.created else REBUILT,
                invoice,
                by,
                month=f"{month:%Y-%m}",
                total=str(totals.total),
            )
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
    audit.record(
        "month.closed",
        summary=MONTH_CLOSED,
        values={
            "month": f"{month:%Y-%m}",
            "created": len(closing.created),
            "rebuilt": len(closing.rebuilt),
            "kept": len(closing.kept),
        },
        actor=by,
        subject=("month", f"{month:%Y-%m}"),
        details={
            "created": [i.pk for i in closing.created],
            "rebuilt": [i.pk for i in closing.rebuilt],
            "kept": [i.pk for i in closing.kept],
        },
    )
    return closing
