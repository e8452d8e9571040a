"""The Celery application shared by the web process, workers and beat, and what every task run reports:
its logs in the portal's format (with the request id it was sent under), its duration and failures.

Which tasks beat sends, and which run on a queue of their own, each app declares in its plugin
(`portal.shell.Periodic`, `portal.shell.Route`); this module reads them once Django's apps are loaded.
"""

import os

from celery import Celery, signals

from portal import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def route_to_own_queue(name, args, kwargs, options, task=None, **kw):
    """Celery's router: the queue an app's plugin gives the task, else the default queue."""
    from portal import shell

    route = shell.task_routes().get(name)
    return route or None


app.conf.task_routes = (route_to_own_queue,)


@app.on_after_finalize.connect(weak=False)
def schedule_periodic_tasks(sender, **kwargs) -> None:
    """Beat's schedule, from every app's plugin (a worker or beat finalizes once Django is set up)."""
    from django.apps import apps

    from portal import shell

    if apps.ready:
        sender.conf.beat_schedule = {**sender.conf.beat_schedule, **shell.beat_schedule()}


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
