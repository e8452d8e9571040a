"""What each change of an invoice leaves in the audit trail: its sentence (translated where it is read)
and the invoice's number, month and state."""

from __future__ import annotations

from django.utils.translation import gettext_noop

from billing.models import Invoice
from portal import audit

DRAFTED = gettext_noop("Draft invoice of %(month)s made (%(total)s %(currency)s)")
REBUILT = gettext_noop("Draft invoice of %(month)s rebuilt (%(total)s %(currency)s)")
MONTH_CLOSED = gettext_noop("%(month)s closed: %(created)s draft(s) made, %(rebuilt)s rebuilt, %(kept)s kept")
ISSUED = gettext_noop("Invoice %(number)s issued (%(total)s %(currency)s)")
PAID = gettext_noop("Invoice %(number)s marked paid")
VOIDED = gettext_noop("Invoice %(number)s void: %(reason)s")
CREDITED = gettext_noop(
    "Credit note %(number)s of %(total)s %(currency)s against invoice %(invoice)s: %(reason)s"
)


def record(action: str, summary: str, invoice: Invoice, by, **values) -> None:
    """One change of `invoice` by `by` (None: the portal itself), with the values of its sentence."""
    audit.record(
        action,
        summary=summary,
        values={"number": invoice.number or f"#{invoice.pk}", "currency": invoice.currency, **values},
        actor=by,
        tenant_id=invoice.tenant_id,
        subject=("invoice", invoice.pk),
        details={"month": f"{invoice.month:%Y-%m}", "state": invoice.state},
    )
