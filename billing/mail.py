"""E-mailing issued invoices and credit notes to the tenant, each with its PDF, once.

Who gets it: the tenant's billing contact (the billing profile's contact e-mail); without one, the
tenant's admins who have not turned the topic `EMAIL_TOPIC` off. Issuing queues the Celery task once
the issue commits (`portal.dispatch`); the task sends through `portal.mail.send_once` (once per document
and address) and records who it went to (an `InvoiceMail`, shown in the admin) in the transaction that
sends, under the document's row lock, so a task that runs twice or twice at once sends one e-mail.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from billing import exports
from billing.apps import EMAIL_TOPIC
from billing.invoicing import round_money
from billing.models import BillingProfile, CreditNote, Invoice, InvoiceMail, InvoiceState
from portal import dispatch, mail, permissions
from portal.models import Preferences, Tenant

# The tasks that send them (billing/tasks.py), by name: services never import the task module.
INVOICE_EMAIL = "billing.tasks.email_invoice"
CREDIT_NOTE_EMAIL = "billing.tasks.email_credit_note"
SENT, ALREADY_SENT, NOBODY, NOT_ISSUED = "sent", "already sent", "nobody to send to", "not issued"


def queue_invoice(invoice_id: int) -> None:
    dispatch.after_commit(INVOICE_EMAIL, invoice_id)


def queue_credit_note(credit_note_id: int) -> None:
    dispatch.after_commit(CREDIT_NOTE_EMAIL, credit_note_id)


def recipients(tenant: Tenant) -> list[str]:
    """The billing contact, else the admins of the tenant who want these e-mails."""
    contact = BillingProfile.objects.filter(tenant=tenant).values_list("contact_email", flat=True).first()
    if contact:
        return [contact]
    admins = permissions.tenant_admins(tenant_id=tenant.pk).exclude(email="")
    return [admin.email for admin in admins if Preferences.wants_email(admin, EMAIL_TOPIC)]


def _send(
    kind: str, document: Invoice | CreditNote, tenant: Tenant, context: dict, make_file: Callable
) -> str:
    """E-mail `document` (an "invoice" or a "credit_note", as its template and its `InvoiceMail` field are
    named) with the file `make_file` gives (bytes, content type and name, as billing.exports gives them),
    and record who it went to."""
    to = recipients(tenant)

    def attachments() -> list[mail.Attachment]:
        content, media, name = make_file()
        return [(name, content, media)]

    mail.send_once(
        key=f"billing.{kind}:{document.pk}",
        to=to,
        template=f"billing/email/{kind}",
        context={"tenant": tenant, "total": round_money(document.total, document.currency), **context},
        attachments=attachments,
    )
    InvoiceMail.objects.create(**{kind: document}, recipients=", ".join(to), sent_at=timezone.now())
    return SENT if to else NOBODY


def send_invoice(invoice_id: int) -> str:
    """E-mail an issued invoice with its PDF, unless it was e-mailed already."""
    with transaction.atomic():
        invoice = (
            Invoice.objects.select_for_update(of=("self",))
            .select_related("tenant")
            .filter(pk=invoice_id)
            .first()
        )
        if invoice is None or invoice.state not in (InvoiceState.ISSUED, InvoiceState.PAID):
            return NOT_ISSUED  # a void invoice is not sent
        if InvoiceMail.objects.filter(invoice=invoice).exists():
            return ALREADY_SENT
        context = {"invoice": invoice}
        return _send("invoice", invoice, invoice.tenant, context, lambda: exports.export(invoice, "pdf"))


def send_credit_note(credit_note_id: int) -> str:
    """E-mail a credit note with its PDF, unless it was e-mailed already."""
    with transaction.atomic():
        note = (
            CreditNote.objects.select_for_update(of=("self",))
            .select_related("invoice__tenant")
            .filter(pk=credit_note_id)
            .first()
        )
        if note is None:
            return NOT_ISSUED
        if InvoiceMail.objects.filter(credit_note=note).exists():
            return ALREADY_SENT
        tenant, context = note.invoice.tenant, {"note": note, "invoice": note.invoice}
        return _send("credit_note", note, tenant, context, lambda: exports.export_credit_note(note))
