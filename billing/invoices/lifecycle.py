"""An invoice after its month is closed: issued (a gap-free number of its year), paid or void. An issued
invoice never changes; the database refuses it whatever the code does. Issuing e-mails it to the tenant
once committed (billing/mail.py)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from billing import mail
from billing.conf import settings
from billing.invoices.trail import ISSUED, PAID, VOIDED, record
from billing.models import Invoice, InvoiceSequence, InvoiceState
from portal import audit
from portal.errors import Conflict, InvalidInput


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
        record("invoice.issued", ISSUED, invoice, by, total=str(invoice.total))
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
        record("invoice.paid", PAID, invoice, by)
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
        record("invoice.voided", VOIDED, invoice, by, reason=audit.text(invoice.void_reason))
    return invoice
