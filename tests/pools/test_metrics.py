"""Pools' figures on /metrics (pools/metrics.py): requests waiting, pools by state, how long provisioning
takes, and the pools past their deadlines."""

from datetime import timedelta

import pytest
from django.utils import timezone

from pools import metrics
from pools.conf import settings as pools_settings
from pools.models import PoolEvent, PoolState, RequestState
from tests.factories import ClusterFactory, PoolFactory, PoolRequestFactory

pytestmark = pytest.mark.django_db


def collected() -> dict:
    return {family.name: family for family in metrics.collect()}


def values(family) -> dict:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value for sample in family.samples}


def test_requests_waiting_and_pools_by_state(tenancy):
    cluster = ClusterFactory()
    now = timezone.now()
    PoolRequestFactory(project=tenancy.vision, state=RequestState.QUEUED)
    PoolRequestFactory(project=tenancy.vision, state=RequestState.QUEUED)
    approved = PoolRequestFactory(project=tenancy.vision, state=RequestState.APPROVED)
    type(approved).objects.filter(pk=approved.pk).update(approved_at=now - timedelta(minutes=20))
    PoolRequestFactory(project=tenancy.vision, state=RequestState.SUBMITTED)
    for state in (PoolState.ACTIVE, PoolState.ACTIVE, PoolState.FAILED):
        PoolFactory(project=tenancy.vision, cluster=cluster, state=state)

    found = collected()

    waiting = found["gpu_portal_requests_waiting"]
    assert values(waiting) == {
        ("gpu_portal_requests_waiting", (("state", "approved"),)): 1,
        ("gpu_portal_requests_waiting", (("state", "queued"),)): 2,
    }
    oldest = found["gpu_portal_requests_waiting_oldest_seconds"].samples[0].value
    assert oldest == pytest.approx(1200, abs=30)
    by_state = values(found["gpu_portal_pools"]).items()
    pools = {dict(labels)["state"]: value for (_name, labels), value in by_state}
    assert pools == {
        "provisioning": 0,
        "active": 2,
        "reclaiming": 0,
        "releasing": 0,
        "released": 0,
        "failed": 1,
    }


def test_nothing_waiting_is_zero_not_missing(db):
    found = collected()
    assert found["gpu_portal_requests_waiting_oldest_seconds"].samples[0].value == 0
    assert found["gpu_portal_pools_overdue_oldest_seconds"].samples[0].value == 0


def test_provisioning_times_are_a_summary_of_the_last_day_and_of_all_time(tenancy):
    cluster = ClusterFactory()
    now = timezone.now()
    # Provisioning that took 60 s and 120 s; one that failed after 600 s, two days ago.
    runs = ((60, PoolState.ACTIVE, 0), (120, PoolState.ACTIVE, 0), (600, PoolState.FAILED, 2))
    for seconds, outcome, days_ago in runs:
        pool = PoolFactory(project=tenancy.vision, cluster=cluster, state=outcome)
        event = PoolEvent.objects.create(
            request=pool.request, pool=pool, from_state=PoolState.PROVISIONING, to_state=outcome
        )
        at = now - timedelta(days=days_ago)
        PoolEvent.objects.filter(pk=event.pk).update(at=at)
        type(pool).objects.filter(pk=pool.pk).update(reserved_at=at - timedelta(seconds=seconds))

    provisioning = collected()["gpu_portal_pool_provisioning_seconds"]

    assert provisioning.type == "summary"
    by = values(provisioning)
    active, failed = (("outcome", "active"),), (("outcome", "failed"),)
    assert by[("gpu_portal_pool_provisioning_seconds_count", active)] == 2
    assert by[("gpu_portal_pool_provisioning_seconds_sum", active)] == pytest.approx(180)
    median = ("gpu_portal_pool_provisioning_seconds", (("outcome", "active"), ("quantile", "0.5")))
    assert by[median] == pytest.approx(90)
    assert by[("gpu_portal_pool_provisioning_seconds_count", failed)] == 1  # since ever
    assert by[("gpu_portal_pool_provisioning_seconds_sum", failed)] == pytest.approx(600)
    recent = by[("gpu_portal_pool_provisioning_seconds", (("outcome", "failed"), ("quantile", "0.9")))]
    assert recent != recent  # NaN: none in the last 24 hours


def test_pools_past_their_deadlines(tenancy):
    cluster = ClusterFactory()
    now = timezone.now()
    # One pool past the sweeper's re-drive deadline, one past the point where it should have failed it.
    for past in (pools_settings.POOL_REDRIVE_SECONDS + 60, pools_settings.POOL_STUCK_SECONDS + 60):
        PoolFactory(
            project=tenancy.vision,
            cluster=cluster,
            state=PoolState.PROVISIONING,
            reserved_at=now - timedelta(seconds=past),
        )

    found = collected()

    overdue = {
        (dict(labels)["state"], dict(labels)["deadline"]): value
        for (_name, labels), value in values(found["gpu_portal_pools_overdue"]).items()
    }
    assert overdue == {
        ("provisioning", "redrive"): 1,
        ("provisioning", "stuck"): 1,
        ("releasing", "redrive"): 0,
        ("releasing", "stuck"): 0,
    }
    oldest = found["gpu_portal_pools_overdue_oldest_seconds"].samples[0].value
    assert oldest == pytest.approx(pools_settings.POOL_STUCK_SECONDS + 60, abs=30)
