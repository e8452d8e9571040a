"""The picture of the fleet behind availability is reused while the capacity version holds, and every
change made through the portal's services bumps that version."""

import pytest

from pools import capacity_version, selectors
from pools.models import GpuCapacity, NodeCapacity
from pools.services import admit_waiting, approve_request, set_gpu_drained, set_node_group, submit_request
from pools.services.inventory import sync_inventory
from tests.factories import GpuGroupFactory


@pytest.fixture
def reused(settings, sim_cluster):
    settings.CAPACITY_PICTURE_SECONDS = 300
    sync_inventory(cluster=sim_cluster)
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


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_other_processes_read_the_built_picture_back(settings, sim_cluster, monkeypatch):
    """Under load capacity changes every few seconds; one process builds each version's picture, the
    other web and worker processes read it from the shared cache (bench/load.py measured the cost)."""
    from django.core.cache import cache
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from pools.selectors import capacity

    settings.CAPACITY_PICTURE_SECONDS = 300
    sync_inventory(cluster=sim_cluster)
    built = selectors.capacity_picture()
    monkeypatch.setattr(capacity.PICTURE, "held", None)  # another process: it holds no picture yet
    with CaptureQueriesContext(connection) as reads:
        shared = selectors.capacity_picture()
    assert len(reads) == 0
    assert shared is not built and shared.found == built.found
    assert h100_full() == 8

    set_gpu_drained(gpu=GpuCapacity.objects.get(node__name="h100-1", index=0), drained=True)
    monkeypatch.setattr(capacity.PICTURE, "held", None)
    with CaptureQueriesContext(connection) as reads:
        assert h100_full() == 7  # a new version: built afresh, not an old picture read back
    assert len(reads) > 0

    with transaction.atomic():  # read inside a transaction: kept by this process only
        capacity_version.changed()
        selectors.capacity_picture()
        version = capacity_version.current()
        assert cache.get(capacity.PICTURE.key.format(version=version)) is None


def test_a_shared_picture_keeps_its_age(settings, reused, monkeypatch):
    """A picture read back from the cache is kept only for what is left of the time bound."""
    import time

    from django.core.cache import cache

    from pools.selectors import capacity

    picture = selectors.capacity_picture()
    version = capacity_version.current()
    monkeypatch.setattr(capacity.PICTURE, "held", None)
    cache.set(capacity.PICTURE.key.format(version=version), (time.time() - 299.5, picture))
    assert selectors.capacity_picture() is not picture  # unpickled from the cache
    held_version, held_since, _held = capacity.PICTURE.held
    assert held_version == version and time.monotonic() - held_since >= 299


def test_the_fleet_snapshot_reads_values_in_two_queries(fleet, tenancy, approver, django_assert_num_queries):
    """The snapshot behind every picture and admission reads plain values (no model per GPU), in a
    fixed number of queries, and still sees groups, drains, MIG slots and whole GPUs taken."""
    from django.db.models.signals import post_init

    from pools.selectors import fleet_snapshot

    group = GpuGroupFactory(cluster=fleet, name="training")
    NodeCapacity.objects.filter(name="h200-2").update(group=group)
    NodeCapacity.objects.filter(name="h100-1").update(drained=True)
    items = [("h200-141gb.full", 1), ("h200-141gb.mig-1g.18gb", 2)]
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items, cluster=fleet)
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    made = []

    def count(sender, **kwargs):
        made.append(sender)

    post_init.connect(count)
    try:
        with django_assert_num_queries(2):
            gpus = fleet_snapshot([fleet], {fleet.pk: True})["sim"].gpus
    finally:
        post_init.disconnect(count)
    assert made == []  # no model instance: plain values only

    def on(node):
        return [g for g in gpus if g.node == f"sim/{node}"]

    assert len(gpus) == 24 and all(g.cluster == "sim" for g in gpus)
    assert not any(g.schedulable for g in on("h100-1")) and all(g.schedulable for g in on("h200-1"))
    assert {g.group for g in on("h200-2")} == {"training"} and {g.group for g in on("h200-1")} == {None}
    assert sum(g.allocated for g in gpus) == 1  # the whole GPU
    assert sum(s.allocated for g in gpus for s in g.instances) == 2  # the two MIG slots
    assert [s.profile for s in on("h200-1")[0].instances] == ["1g.18gb"] * 7
