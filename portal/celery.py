"""The Celery application shared by the web process, workers and beat, and what every task run reports:
its logs in the portal's format (with the request id it was sent under), its duration and failures."""

import os

from celery import Celery, signals

from portal import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

signals.task_prerun.connect(telemetry.task_started, weak=False)
signals.task_postrun.connect(telemetry.task_ended, weak=False)
signals.task_failure.connect(telemetry.task_failed, weak=False)


@signals.setup_logging.connect(weak=False)
def use_portal_logging(**kwargs) -> None:
    """Workers and beat log as the web does (settings.LOGGING), not in Celery's own format."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


@signals.worker_init.connect(weak=False)
@signals.beat_init.connect(weak=False)
def serve_metrics(**kwargs) -> None:
    """With CELERY_METRICS_PORT, the worker's main process (or beat) serves the figures of its tasks."""
    port = os.environ.get("CELERY_METRICS_PORT")
    if port:
        telemetry.serve(int(port))
