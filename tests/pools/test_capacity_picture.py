"""The picture of the fleet behind availability is reused while the capacity version holds, and every
change made through the portal's services bumps that version."""

import pytest

from pools import capacity_version, selectors
from pools.models import GpuCapacity, NodeCapacity
from pools.services import admit_waiting, approve_request, set_gpu_drained, set_node_group, submit_request
from pools.sync import sync_cluster
from tests.factories import GpuGroupFactory


@pytest.fixture
def reused(settings, sim_cluster):
    settings.CAPACITY_PICTURE_SECONDS = 300
    sync_cluster(cluster=sim_cluster)
    return sim_cluster


def h100_full(**filters) -> int:
    offers = {o.spec.id: o for o in selectors.spec_offers(**filters)}
    return offers["h100-80gb.full"].available


def test_the_picture_is_kept_until_capacity_changes(reused, tenancy, staff_user):
    first = selectors.capacity_picture()
    assert selectors.capacity_picture() is first  # nothing changed: built once
    GpuCapacity.objects.filter(node__name="h100-1", index=0).update(drained=True)
    assert h100_full() == 8  # a change behind the services' backs waits for the time bound

    gpu = GpuCapacity.objects.get(node__name="h100-1", index=1)
    set_gpu_drained(gpu=gpu, drained=True)
    assert h100_full() == 6  # the service bumped the version: both drains show

    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 2)])
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    assert h100_full() == 4  # an admission reserves under the capacity lock, which bumps it


def test_group_changes_bump_the_version(reused):
    before = capacity_version.current()
    group = GpuGroupFactory(cluster=reused, name="training")
    set_node_group(node=NodeCapacity.objects.get(name="h100-1"), group=group)
    assert capacity_version.current() != before
    assert h100_full(purpose="training") == 8


def test_the_time_bound_holds_whatever_slips_past(reused, settings):
    first = selectors.capacity_picture()
    settings.CAPACITY_PICTURE_SECONDS = 0
    assert selectors.capacity_picture() is not first


def test_a_cleared_cache_starts_at_a_new_number(db):
    from django.core.cache import cache

    before = capacity_version.current()
    cache.clear()
    assert capacity_version.current() != before
