"""Finance's reads: a month's invoices with last month's totals beside them, what is due and overdue,
and the totals of the months before for the chart.

An invoice is overdue once it has stayed issued (not paid, not void) BILLING_PAYMENT_DAYS after it
was issued; `overdue_before` is the one place that says so, for the tiles, the rows and the filters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum

from billing.conf import settings
from billing.models import Invoice, InvoiceState

CHART_MONTHS = 12


def overdue_before(now: datetime) -> datetime:
    """Issued before this moment and still unpaid: overdue."""
    return now - timedelta(days=settings.BILLING_PAYMENT_DAYS)


def overdue(invoices: QuerySet[Invoice], now: datetime) -> QuerySet[Invoice]:
    return invoices.filter(state=InvoiceState.ISSUED, issued_at__lt=overdue_before(now))


def is_overdue(invoice: Invoice, now: datetime) -> bool:
    return (
        invoice.state == InvoiceState.ISSUED
        and invoice.issued_at is not None
        and invoice.issued_at < overdue_before(now)
    )


def due_at(invoice: Invoice) -> datetime | None:
    return invoice.issued_at + timedelta(days=settings.BILLING_PAYMENT_DAYS) if invoice.issued_at else None


def shift(month: date, months: int) -> date:
    """The first day of the month `months` later (or earlier, when negative)."""
    index = month.year * 12 + month.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


@dataclass(frozen=True)
class StateTotal:
    state: str
    label: str
    count: int
    total: Decimal


@dataclass
class MonthTotals:
    """The month's invoices by state, overdue ones (a part of issued) counted apart."""

    states: list[StateTotal]
    overdue_count: int
    overdue_total: Decimal
    billed: Decimal  # every invoice that is not void


def month_totals(month: date, *, now: datetime) -> MonthTotals:
    invoices = Invoice.objects.filter(month=month)
    found = {
        row["state"]: row
        for row in invoices.values("state").annotate(count=Count("pk"), total=Sum("total")).order_by()
    }
    states = [
        StateTotal(
            state.value,
            state.label,
            found.get(state.value, {}).get("count", 0),
            found.get(state.value, {}).get("total") or Decimal(0),
        )
        for state in InvoiceState
    ]
    late = overdue(invoices, now).aggregate(count=Count("pk"), total=Sum("total"))
    billed = sum((row.total for row in states if row.state != InvoiceState.VOID), Decimal(0))
    return MonthTotals(states, late["count"], late["total"] or Decimal(0), billed)


@dataclass
class Row:
    """One invoice of the month beside its tenant's invoice of the month before."""

    invoice: Invoice
    previous: Decimal | None
    overdue: bool
    due_at: datetime | None

    @property
    def change(self) -> Decimal | None:
        return None if self.previous is None else self.invoice.total - self.previous

    @property
    def change_percent(self) -> Decimal | None:
        if self.previous in (None, Decimal(0)):
            return None
        return (self.change / self.previous * 100).quantize(Decimal("0.1"))


def month_invoices(month: date, *, state: str = "", now: datetime) -> QuerySet[Invoice]:
    """The month's invoices, by tenant name; `state` may be one of the states, or `overdue`."""
    invoices = Invoice.objects.filter(month=month).select_related("tenant", "tenant__billing_profile")
    if state == "overdue":
        invoices = overdue(invoices, now)
    elif state:
        invoices = invoices.filter(state=state)
    return invoices.order_by("tenant__name", "tenant_id", "created_at")


def rows(invoices: list[Invoice], month: date, *, now: datetime) -> list[Row]:
    """Rows of one page of invoices, with the previous month's total of each tenant (one query)."""
    previous = dict(
        Invoice.objects.filter(month=shift(month, -1), tenant_id__in={i.tenant_id for i in invoices})
        .exclude(state=InvoiceState.VOID)
        .values_list("tenant_id", "total")
    )
    return [
        Row(
            invoice,
            None if invoice.state == InvoiceState.VOID else previous.get(invoice.tenant_id),
            is_overdue(invoice, now),
            due_at(invoice),
        )
        for invoice in invoices
    ]


@dataclass
class History:
    """Totals of the months up to one, per state: paid, issued (unpaid) and draft."""

    months: list[date]
    totals: dict[str, list[Decimal]] = field(default_factory=dict)


def history(last: date, *, months: int = CHART_MONTHS) -> History:
    first = shift(last, -(months - 1))
    span = [shift(first, step) for step in range(months)]
    sums: dict[str, dict[date, Decimal]] = defaultdict(dict)
    found = (
        Invoice.objects.filter(month__gte=first, month__lte=last)
        .filter(~Q(state=InvoiceState.VOID))
        .values("month", "state")
        .annotate(total=Sum("total"))
        .order_by()
    )
    for row in found:
        sums[row["state"]][row["month"]] = row["total"]
    shown = (InvoiceState.PAID, InvoiceState.ISSUED, InvoiceState.DRAFT)
    return History(span, {state: [sums[state].get(month, Decimal(0)) for month in span] for state in shown})
