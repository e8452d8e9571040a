"""The monitoring app: GPU samples, alerts and metrics."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from portal.shell import AppPlugin


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = _("Monitoring")
    plugin = AppPlugin(
        urls="monitoring.urls",
        api="monitoring.api",
    )
