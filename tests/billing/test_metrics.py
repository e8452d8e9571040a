"""Billing's figure on /metrics (billing/metrics.py): how far metering lags behind."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import metrics
from billing.services import metering_lag
from tests.factories import ClusterFactory, PoolFactory

pytestmark = pytest.mark.django_db


def lag() -> float:
    (family,) = metrics.collect()
    assert family.name == "gpu_portal_metering_lag_seconds" and family.type == "gauge"
    return family.samples[0].value


def test_the_metering_lag_is_billings_own_figure(tenancy):
    assert lag() == 0  # nothing to meter
    held_since = timezone.now() - timedelta(hours=3)  # hours ended and not metered
    PoolFactory(
        allocated=True,
        project=tenancy.vision,
        cluster=ClusterFactory(),
        state="active",
        reserved_at=held_since,
    )

    found = lag()

    assert found > 3600 and found == pytest.approx(metering_lag().total_seconds(), abs=30)
