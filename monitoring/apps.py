"""The monitoring app: GPU samples, alerts and metrics."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from portal.shell import AppPlugin, EmailTopic, Link

# The e-mails of alerts firing and resolving (monitoring/notifications.py), to operators who keep it on.
EMAIL_TOPIC = "alerts"
# The e-mails about a GPU fault under a pool (monitoring/faults.py), to its people and to approvers.
FAULT_EMAIL_TOPIC = "gpu-faults"


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = _("Monitoring")
    plugin = AppPlugin(
        urls="monitoring.urls",
        api="monitoring.api",
        nav=(
            Link(_("Monitoring"), "monitoring-fleet", permission="monitoring.view_latest"),
            Link(_("Alerts"), "monitoring-alerts", permission="monitoring.view_alert"),
            Link(_("GPU faults"), "monitoring-faults", permission="monitoring.view_gpufault"),
        ),
        pool_sections=("monitoring.tenant_views.pool_section", "monitoring.fault_views.pool_section"),
        capacity_sections=("monitoring.capacity_views.section",),
        tenant_sections=("monitoring.tenant_views.tenant_section",),
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
        ),
    )
