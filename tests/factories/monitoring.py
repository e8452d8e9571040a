"""Factories of monitoring's given state: alert rules and open alerts."""

import factory
from django.utils import timezone

from tests.factories.capacity import GpuCapacityFactory


class AlertRuleFactory(factory.django.DjangoModelFactory):
    """A rule, the default temperature one unless told: `AlertRuleFactory(name="Idle", kind="idle_pool",
    threshold=5)`. Rules are found by name, so the default rules of a fresh database are reused."""

    class Meta:
        model = "monitoring.AlertRule"
        django_get_or_create = ["name"]

    name = "GPU too hot"
    kind = "threshold"
    metric = factory.LazyAttribute(lambda r: "temperature_c" if r.kind == "threshold" else "")
    threshold = factory.LazyAttribute(lambda r: 85.0 if r.kind in ("threshold", "idle_pool") else None)
    duration_seconds = 300


class AlertFactory(factory.django.DjangoModelFactory):
    """An open alert of the temperature rule on a GPU, fired now, as given state:
    `AlertFactory(gpu=gpu, severity="critical", resolved_at=timezone.now())`. Alerts a test is about come
    from `monitoring.alerts.services.evaluate`."""

    class Meta:
        model = "monitoring.Alert"

    rule = factory.SubFactory(AlertRuleFactory)
    gpu = factory.SubFactory(GpuCapacityFactory)
    slot = -1
    subject = factory.LazyAttribute(lambda a: f"gpu:{a.gpu.pk}")
    message = "temperature (°C) above 85 °C for 5 min: 90.0 °C"
    value = 90.0
    severity = "warning"
    resolved_at = None
    fired_at = factory.LazyAttribute(lambda a: min(timezone.now(), a.resolved_at or timezone.now()))
    last_seen_at = factory.LazyAttribute(lambda a: a.fired_at)
