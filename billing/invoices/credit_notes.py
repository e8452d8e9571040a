"""Credit notes, the only correction of an issued invoice: part (or all) of it given back, with the
invoice's tax on it. The credit notes of an invoice never add up to more than its total; each is
e-mailed to the tenant once committed (billing/mail.py)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from billing import invoicing, mail
from billing.invoices.lifecycle import next_number
from billing.invoices.trail import CREDITED
from billing.models import CreditNote, Invoice, InvoiceSequence, InvoiceState
from portal import audit
from portal.errors import Conflict, InvalidInput


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
