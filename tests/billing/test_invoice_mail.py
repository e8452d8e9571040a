"""Issued invoices and credit notes are e-mailed with their PDF once each: to the tenant's billing
contact, else to its admins who did not turn the topic off; a task run twice, or twice at once, sends
one e-mail."""

import threading
import time
from decimal import Decimal

import pytest
from django.core import mail
from django.db import connection

from billing import mail as billing_mail
from billing.apps import EMAIL_TOPIC
from billing.invoices import credit, issue
from billing.models import BillingProfile, InvoiceMail
from portal.dispatch import Send
from portal.models import Preferences, Role, SentEmail
from portal.shell import email_topics
from tests.billing.test_credit_notes import AFTER, november_invoices
from tests.factories import MembershipFactory


def billing_sends(callbacks) -> list[Send]:
    return [c for c in callbacks if isinstance(c, Send) and c.task.startswith("billing.")]


def test_issuing_queues_one_e_mail_that_sends_the_pdf_to_the_billing_contact_once(
    tenancy, django_capture_on_commit_callbacks
):
    BillingProfile.objects.create(tenant=tenancy.acme, contact_email="billing@acme.example")
    draft = november_invoices(tenancy)["acme"]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        invoice = issue(invoice_id=draft.pk, at=AFTER)
    assert billing_sends(callbacks) == [Send("billing.tasks.email_invoice", (invoice.pk,))]

    from billing.tasks import email_invoice

    assert email_invoice(invoice.pk) == "sent"
    assert email_invoice(invoice.pk) == "already sent"  # a redelivered task
    (sent,) = mail.outbox
    assert sent.to == ["billing@acme.example"]
    assert "2026-00001" in sent.subject and "2026-11" in sent.subject
    assert "27720 KRW" in sent.body
    ((name, content, media),) = sent.attachments
    assert (name, media) == ("invoice-2026-00001-acme.pdf", "application/pdf")
    assert content.startswith(b"%PDF")
    assert InvoiceMail.objects.get(invoice=invoice).recipients == "billing@acme.example"
    sent_to = SentEmail.objects.filter(key=f"billing.invoice:{invoice.pk}").values_list("address", flat=True)
    assert list(sent_to) == ["billing@acme.example"]  # the shell's record of e-mails sent once


def test_without_a_contact_the_admins_who_want_it_get_it(tenancy):
    carol = MembershipFactory(tenant=tenancy.acme, role=Role.ADMIN, user__username="carol").user
    MembershipFactory(tenant=tenancy.globex, role=Role.ADMIN, user__username="gina")  # another tenant's
    Preferences.objects.create(user=carol, emails_off=[EMAIL_TOPIC])
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    assert billing_mail.send_invoice(invoice.pk) == "sent"
    (sent,) = mail.outbox
    assert sent.to == [tenancy.acme_admin.email]  # not carol, nor members, nor globex's admin


def test_nobody_gets_it_when_every_admin_turned_the_topic_off(tenancy):
    assert EMAIL_TOPIC in [topic.key for topic in email_topics()]
    Preferences.objects.create(user=tenancy.acme_admin, emails_off=[EMAIL_TOPIC])
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    assert billing_mail.send_invoice(invoice.pk) == "nobody to send to"
    assert billing_mail.send_invoice(invoice.pk) == "already sent"
    assert mail.outbox == []
    assert InvoiceMail.objects.get(invoice=invoice).recipients == ""


def test_a_credit_note_is_e_mailed_once_with_its_pdf(tenancy, django_capture_on_commit_callbacks):
    BillingProfile.objects.create(tenant=tenancy.acme, contact_email="billing@acme.example")
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        note = credit(invoice_id=invoice.pk, amount=Decimal("1000"), reason="broken GPU", at=AFTER)
    assert billing_sends(callbacks) == [Send("billing.tasks.email_credit_note", (note.pk,))]

    from billing.tasks import email_credit_note

    assert email_credit_note(note.pk) == "sent"
    assert email_credit_note(note.pk) == "already sent"
    (sent,) = mail.outbox
    assert sent.to == ["billing@acme.example"]
    assert "CN-2026-00001" in sent.subject and "2026-00001" in sent.subject
    assert "broken GPU" in sent.body and "1100 KRW" in sent.body
    ((name, content, media),) = sent.attachments
    assert (name, media) == ("credit-note-CN-2026-00001-acme.pdf", "application/pdf")
    assert content.startswith(b"%PDF")


def test_a_void_invoice_is_not_sent(tenancy):
    from billing.invoices import void

    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    void(invoice_id=invoice.pk, reason="duplicate")
    assert billing_mail.send_invoice(invoice.pk) == "not issued"
    assert mail.outbox == [] and not InvoiceMail.objects.exists()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_runs_at_once_send_one_e_mail(tenancy):
    BillingProfile.objects.create(tenant=tenancy.acme, contact_email="billing@acme.example")
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    barrier = threading.Barrier(3)
    answers, failures = [], []

    def run():
        try:
            barrier.wait()
            answers.append(billing_mail.send_invoice(invoice.pk))
        except Exception as error:  # reported below
            failures.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert sorted(answers) == ["already sent", "already sent", "sent"]
    assert len(mail.outbox) == 1 and InvoiceMail.objects.count() == 1


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_worker_e_mails_an_issued_invoice_once(celery_worker, tenancy):
    from billing.tasks import email_invoice

    BillingProfile.objects.create(tenant=tenancy.acme, contact_email="worker-billing@acme.example")
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)

    def mails() -> list[str]:
        found = (
            (path.read_text() for path in celery_worker.mail_dir.iterdir())
            if celery_worker.mail_dir.exists()
            else ()
        )
        return [text for text in found if "worker-billing@acme.example" in text]

    deadline = time.monotonic() + 60
    while not InvoiceMail.objects.filter(invoice=invoice).exists():
        assert time.monotonic() < deadline, celery_worker.log.read_text()[-3000:]
        time.sleep(0.2)
    assert email_invoice.delay(invoice.pk).get(timeout=30) == "already sent"
    (sent,) = mails()
    assert 'filename="invoice-2026-00001-acme.pdf"' in sent
