"""The GPU portal site: settings, URLs, the Celery app and tenancy."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
