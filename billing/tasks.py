"""Celery tasks of billing: thin wrappers over its services, safe to run twice or at once."""

from celery import shared_task

from billing import services


@shared_task(name="billing.tasks.meter_usage")
def meter_usage() -> str:
    return services.meter().summary()
