"""Billing's figure on /metrics (`collect`, served by portal/metrics.py through billing's plugin):
gpu_portal_metering_lag_seconds, how long the oldest period that could be metered has waited beyond the
metering delay (billing.services.metering_lag)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from billing.services import metering_lag


def collect() -> Iterator[Metric]:
    """The metering lag, read now (the plugin's `metrics` entry)."""
    yield GaugeMetricFamily(
        "gpu_portal_metering_lag_seconds",
        "How long the oldest period that could be metered has waited beyond the metering delay.",
        value=metering_lag().total_seconds(),
    )
