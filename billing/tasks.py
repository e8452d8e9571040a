"""Celery tasks of billing: thin wrappers over its services, safe to run twice or at once."""

from celery import shared_task

from billing import mail, services
from billing.budgets import warnings


@shared_task(name="billing.tasks.meter_usage")
def meter_usage() -> str:
    return services.meter().summary()


@shared_task(name="billing.tasks.warn_budgets")
def warn_budgets() -> str:
    return warnings.warn().summary()


@shared_task(
    name=mail.INVOICE_EMAIL, autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600,
    max_retries=8,
)  # fmt: skip
def email_invoice(invoice_id: int) -> str:
    return mail.send_invoice(invoice_id)


@shared_task(
    name=mail.CREDIT_NOTE_EMAIL, autoretry_for=(OSError,), retry_backoff=True,
    retry_backoff_max=600, max_retries=8,
)  # fmt: skip
def email_credit_note(credit_note_id: int) -> str:
    return mail.send_credit_note(credit_note_id)
