"""E-mailing issued invoices and credit notes to the tenant, each with its PDF, once.

Who gets it: the tenant's billing contact (the billing profile's contact e-mail); without one, the
tenant's admins who have not turned the topic `EMAIL_TOPIC` off. Issuing queues the Celery task once
the issue commits; the task records the sending (an `InvoiceMail`) in the transaction that sends, under
the document's row lock, so a task that runs twice or twice at once sends one e-mail.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone, translation

from billing import exports
from billing.apps import EMAIL_TOPIC
from billing.invoicing import round_money
from billing.models import BillingProfile, CreditNote, Invoice, InvoiceMail, InvoiceState
from pools.services import dispatch
from portal import mail
from portal.models import Preferences, Role, Tenant

Attachment = tuple[bytes, str, str]  # bytes, content type, file name

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
    admins = (
        get_user_model()
        .objects.filter(memberships__tenant=tenant, memberships__role=Role.ADMIN, is_active=True)
        .exclude(email="")
        .order_by("username")
    )
    return [admin.email for admin in admins if Preferences.wants_email(admin, EMAIL_TOPIC)]


def _send(
    template: str, context: dict, to: list[str], make_file: Callable[[], tuple[bytes, str, str]]
) -> None:
    """The e-mail of `template` with the file `make_file` gives (bytes, content type, name, as billing.exports
    gives them), written once per language of the recipients, in that language, attachment included."""
    for language, addresses in mail.by_language(to).items():
        with translation.override(language):
            subject = render_to_string(f"billing/email/{template}_subject.txt", context).strip()
            body = render_to_string(f"billing/email/{template}_message.txt", context)
            content, media, name = make_file()
        message = EmailMessage(settings.EMAIL_SUBJECT_PREFIX + subject, body, to=addresses)
        message.attach(name, content, media)
        message.send()


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
        to = recipients(invoice.tenant)
        if to:
            total = round_money(invoice.total, invoice.currency)
            context = {"invoice": invoice, "tenant": invoice.tenant, "total": total}
            _send("invoice", context, to, lambda: exports.export(invoice, "pdf"))
        InvoiceMail.objects.create(invoice=invoice, recipients=", ".join(to), sent_at=timezone.now())
    return SENT if to else NOBODY


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
        tenant = note.invoice.tenant
        to = recipients(tenant)
        if to:
            total = round_money(note.total, note.currency)
            context = {"note": note, "invoice": note.invoice, "tenant": tenant, "total": total}
            _send("credit_note", context, to, lambda: exports.export_credit_note(note))
        InvoiceMail.objects.create(credit_note=note, recipients=", ".join(to), sent_at=timezone.now())
    return SENT if to else NOBODY
