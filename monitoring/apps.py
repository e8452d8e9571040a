"""The monitoring app: GPU samples, alerts, GPU faults and the fleet's figures on /metrics."""

from celery.schedules import crontab
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from monitoring import conf
from portal.shell import AppPlugin, EmailTopic, Link, Periodic, Route, check_queue_settings

# The e-mails of alerts firing and resolving (monitoring/notifications/), to operators who keep it on.
EMAIL_TOPIC = "alerts"
# The e-mails about a GPU fault under a pool (monitoring/faults/), to its people and to approvers.
FAULT_EMAIL_TOPIC = "gpu-faults"
# The e-mail of a billed pool gone idle (monitoring/notifications/idle.py), to who asked and the admins.
IDLE_EMAIL_TOPIC = "idle-pools"

PERIODIC_TASKS = (
    # The simulated fleet and the clusters with a Prometheus URL.
    Periodic(
        "collect-gpu-figures",
        "monitoring.tasks.collect",
        lambda: conf.settings.MONITORING_COLLECT_SECONDS,
    ),
    # Agents' batches waiting to be stored, should the message the first of them sent be lost.
    Periodic(
        "store-accepted-samples",
        "monitoring.tasks.store_accepted_samples",
        lambda: conf.settings.MONITORING_STORE_SECONDS,
    ),
    Periodic("roll-up-gpu-samples", "monitoring.tasks.roll_up_samples", 60),
    # Drops the days past MONITORING_RAW_DAYS, makes the next days' partitions.
    Periodic("prune-gpu-samples", "monitoring.tasks.prune_samples", crontab(minute=7)),
    Periodic("evaluate-alerts", "monitoring.tasks.evaluate_alerts", 60),
    # Retries fall due between runs.
    Periodic("deliver-alert-notifications", "monitoring.tasks.deliver_alert_notifications", 30),
)


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = _("Monitoring")
    plugin = AppPlugin(
        urls="monitoring.urls",
        api="monitoring.ingest.api",
        nav=(
            Link(_("Monitoring"), "monitoring-fleet", permission="monitoring.view_latest"),
            Link(_("Alerts"), "monitoring-alerts", permission="monitoring.view_alert"),
            Link(_("GPU faults"), "monitoring-faults", permission="monitoring.view_gpufault"),
        ),
        pool_sections=(
            "monitoring.pages.idle.pool_section",
            "monitoring.pages.tenant.pool_section",
            "monitoring.faults.views.pool_section",
        ),
        capacity_sections=("monitoring.pages.capacity.section",),
        tenant_sections=("monitoring.pages.tenant.tenant_section",),
        metrics=("monitoring.metrics.collect",),
        bare_views=("v1:monitoring-samples",),
        periodic_tasks=PERIODIC_TASKS,
        # Every monitoring task is one of beat's (a fault sends an evaluation early, an evaluation a
        # delivery): all on MONITORING_QUEUE, so that collection and alerts wait behind no provisioning,
        # metering or other e-mail.
        task_queues=tuple(
            Route(periodic.task, lambda: conf.settings.MONITORING_QUEUE) for periodic in PERIODIC_TASKS
        ),
        email_topics=(
            EmailTopic(
                EMAIL_TOPIC,
                _("e-mail me GPU alerts"),
                _("For operators: each alert when it fires and when it resolves."),
            ),
            EmailTopic(
                FAULT_EMAIL_TOPIC,
                _("e-mail me GPU faults under pools"),
                _("When a GPU holding one of my pools fails and is drained; approvers hear of every pool."),
            ),
            EmailTopic(
                IDLE_EMAIL_TOPIC,
                _("e-mail me idle pools"),
                _(
                    "When a pool I asked for, or one of a tenant I administer, is billed but idle: once each "
                    "time it goes idle, with what the idle hours cost."
                ),
            ),
        ),
    )

    def ready(self) -> None:
        conf.settings.check()
        check_queue_settings(conf.settings, "MONITORING_QUEUE")
