"""Invoices' state changes: closing a month into drafts, issuing (gap-free numbers), paid, void, and
credit notes, the only correction of an issued invoice.

A month is closed in the billing time zone once it has ended and metering has reached its end.
Closing again rebuilds the drafts from the usage records and leaves issued invoices alone, so it
is safe to repeat. An issued invoice never changes; the database refuses it whatever the code does.
A credit note gives part (or all) of an issued invoice back, with the invoice's tax on it; the credit
notes of an invoice never add up to more than its total. Issued invoices and credit notes are e-mailed
to the tenant once committed (billing/mail.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from billing import invoicing, mail, metering
from billing.models import (
    BillingProfile,
    CreditNote,
    Invoice,
    InvoiceLine,
    InvoiceSequence,
    InvoiceState,
    UsageRecord,
)
from billing.services import first_unmetered
from portal import audit
from portal.errors import Conflict, InvalidInput

DRAFTED = gettext_noop("Draft invoice of %(month)s made (%(total)s %(currency)s)")
REBUILT = gettext_noop("Draft invoice of %(month)s rebuilt (%(total)s %(currency)s)")
MONTH_CLOSED = gettext_noop("%(month)s closed: %(created)s draft(s) made, %(rebuilt)s rebuilt, %(kept)s kept")
ISSUED = gettext_noop("Invoice %(number)s issued (%(total)s %(currency)s)")
PAID = gettext_noop("Invoice %(number)s marked paid")
VOIDED = gettext_noop("Invoice %(number)s void: %(reason)s")
CREDITED = gettext_noop(
    "Credit note %(number)s of %(total)s %(currency)s against invoice %(invoice)s: %(reason)s"
)


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


def _record(action: str, summary: str, invoice: Invoice, by, **values) -> None:
    audit.record(
        action,
        summary=summary,
        values={"number": invoice.number or f"#{invoice.pk}", "currency": invoice.currency, **values},
        actor=by,
        tenant_id=invoice.tenant_id,
        subject=("invoice", invoice.pk),
        details={"month": f"{invoice.month:%Y-%m}", "state": invoice.state},
    )


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
            _record(
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


def issue(*, invoice_id: int, at: datetime | None = None, by=None) -> Invoice:
    """Give a draft its number, the next of its year (in the billing time zone) with no gap."""
    at = at or timezone.now()
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.state != InvoiceState.DRAFT:
            raise Conflict(
                _("Invoice %(invoice)s is %(state)s already.")
                % {"invoice": invoice, "state": invoice.get_state_display()}
            )
        invoice.number = next_number(InvoiceSequence.INVOICES, at)
        invoice.state = InvoiceState.ISSUED
        invoice.issued_at = at
        invoice.save(update_fields=["number", "state", "issued_at"])
        _record("invoice.issued", ISSUED, invoice, by, total=str(invoice.total))
        mail.queue_invoice(invoice.pk)
    return invoice


def next_number(series: str, at: datetime) -> str:
    """The next number of a series in the year of `at` (billing time zone): `2026-00001` for invoices,
    `CN-2026-00001` for credit notes. Taken under the sequence row's lock, so gap-free when the caller's
    transaction commits and given back when it rolls back."""
    year = timezone.localtime(at, ZoneInfo(settings.BILLING_TIME_ZONE)).year
    InvoiceSequence.objects.get_or_create(series=series, year=year)
    sequence = InvoiceSequence.objects.select_for_update().get(series=series, year=year)
    sequence.last += 1
    sequence.save(update_fields=["last"])
    return f"{series}-{year}-{sequence.last:05d}" if series else f"{year}-{sequence.last:05d}"


def mark_paid(*, invoice_id: int, at: datetime | None = None, by=None) -> Invoice:
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.state != InvoiceState.ISSUED:
            raise Conflict(
                _("Only an issued invoice can be marked paid; %(invoice)s is %(state)s.")
                % {"invoice": invoice, "state": invoice.get_state_display()}
            )
        invoice.state, invoice.paid_at = InvoiceState.PAID, at or timezone.now()
        invoice.save(update_fields=["state", "paid_at"])
        _record("invoice.paid", PAID, invoice, by)
    return invoice


def void(*, invoice_id: int, reason: str, at: datetime | None = None, by=None) -> Invoice:
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
        _record("invoice.voided", VOIDED, invoice, by, reason=audit.text(invoice.void_reason))
    return invoice


def credited(invoice: Invoice) -> Decimal:
    """The totals of an invoice's credit notes, summed."""
    return invoice.credit_notes.aggregate(total=Sum("total"))["total"] or Decimal(0)


def credit_terms(*, invoice: Invoice, amount, reason: str) -> tuple[Decimal, Decimal, str]:
    """The net amount, tax and reason of a credit note of `invoice`, or the refusal saying why not."""
    if invoice.state not in (InvoiceState.ISSUED, InvoiceState.PAID):
        raise Conflict(
            _("Invoice %(invoice)s is %(state)s: only an issued or paid invoice can be credited.")
            % {"invoice": invoice, "state": invoice.get_state_display()},
            field="invoice",
        )
    currency = invoice.currency
    try:
        amount = amount if isinstance(amount, Decimal) else Decimal(str(amount).strip())
        whole = amount.is_finite() and amount == invoicing.round_money(amount, currency)
    except (InvalidOperation, ValueError):
        raise InvalidInput(_("Give the amount as a number, e.g. 1000."), field="amount") from None
    if not amount.is_finite() or amount <= 0:
        raise InvalidInput(_("The amount to credit must be more than zero."), field="amount")
    if not whole:
        raise InvalidInput(
            _("Amounts in %(currency)s have at most %(digits)d decimal(s).")
            % {"currency": currency, "digits": invoicing.MINOR_DIGITS.get(currency.upper(), 2)},
            field="amount",
        )
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput(_("Say why the invoice is credited."), field="reason")
    tax = invoicing.round_money(amount * invoice.tax_rate / Decimal(100), currency)
    left = invoice.total - credited(invoice)
    if amount + tax > left:
        raise Conflict(
            _(
                "A credit note of %(total)s %(currency)s (%(amount)s plus %(tax)s tax) would be larger than "
                "its invoice %(invoice)s: %(left)s %(currency)s (tax included) is left to credit."
            )
            % {
                "total": invoicing.round_money(amount + tax, currency),
                "amount": invoicing.round_money(amount, currency),
                "tax": tax,
                "invoice": invoice,
                "left": invoicing.round_money(max(left, Decimal(0)), currency),
                "currency": currency,
            },
            field="amount",
        )
    return invoicing.round_money(amount, currency), tax, reason[:2000]


def _invoice_to_credit(invoice_id, *, lock: bool) -> Invoice:
    rows = Invoice.objects.select_for_update() if lock else Invoice.objects.all()
    invoice = rows.filter(pk=invoice_id).first() if isinstance(invoice_id, int) else None
    if invoice is None:
        raise InvalidInput(_("Choose the invoice to credit."), field="invoice")
    return invoice


def check_credit(*, invoice_id: int, amount, reason: str) -> None:
    """Refuse, as `credit` would, without writing (for forms); `credit` checks again under the lock."""
    credit_terms(invoice=_invoice_to_credit(invoice_id, lock=False), amount=amount, reason=reason)


def credit(
    *, invoice_id: int, amount: Decimal, reason: str, by=None, at: datetime | None = None
) -> CreditNote:
    """Issue a credit note of `amount` (net; the invoice's tax rate is added) against an issued or paid
    invoice. The invoice's row is locked, so two credits at once cannot together exceed it."""
    at = at or timezone.now()
    with transaction.atomic():
        invoice = _invoice_to_credit(invoice_id, lock=True)
        subtotal, tax, reason = credit_terms(invoice=invoice, amount=amount, reason=reason)
        note = CreditNote.objects.create(
            invoice=invoice,
            number=next_number(InvoiceSequence.CREDIT_NOTES, at),
            currency=invoice.currency,
            tax_rate=invoice.tax_rate,
            subtotal=subtotal,
            tax=tax,
            total=subtotal + tax,
            reason=reason,
            issued_at=at,
            issued_by=by if getattr(by, "is_authenticated", False) else None,
        )
        audit.record(
            "invoice.credited",
            summary=CREDITED,
            values={
                "number": note.number,
                "total": str(note.total),
                "currency": note.currency,
                "invoice": invoice.number,
                "reason": audit.text(reason),
            },
            actor=by,
            tenant_id=invoice.tenant_id,
            subject=("credit_note", note.pk),
            details={"invoice": invoice.pk, "subtotal": str(subtotal), "tax": str(tax)},
        )
        mail.queue_credit_note(note.pk)
    return note
