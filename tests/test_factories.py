"""The factories make rows the models accept: constraints hold, times are in order, slices never meet."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from pools import mig
from pools.models import Allocation, PoolState, RequestState
from tests.factories import (
    AllocationFactory,
    ClusterFactory,
    GpuCapacityFactory,
    GpuGroupFactory,
    NodeCapacityFactory,
    PoolFactory,
    PoolRequestFactory,
    ProjectFactory,
    RequestItemFactory,
    SpecAndCountFactory,
    WhatIfRunFactory,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "factory",
    [
        GpuGroupFactory,
        NodeCapacityFactory,
        GpuCapacityFactory,
        SpecAndCountFactory,
        PoolRequestFactory,
        RequestItemFactory,
        PoolFactory,
        AllocationFactory,
        WhatIfRunFactory,
    ],
)
def test_each_factory_makes_a_row_that_validates(factory):
    row = factory()
    row.full_clean()


def test_a_node_gets_its_gpus_and_a_gpu_its_mig_layout():
    node = NodeCapacityFactory(gpu_model="H200-141GB", gpus=3, gpus__mig={"1g.18gb": 7})
    node.refresh_from_db()
    assert node.gpu_count == 3 and [g.index for g in node.gpus.all()] == [0, 1, 2]
    gpu = node.gpus.first()
    gpu.full_clean()
    assert gpu.model == "H200-141GB" and gpu.mig_enabled and gpu.schedulable
    assert [i["start"] for i in gpu.layout] == list(range(7))
    mig.validate_layout(
        mig.gpu_model(gpu.model), [mig.Instance(i["start"], i["profile"]) for i in gpu.layout]
    )
    assert GpuCapacityFactory(node=node).index == 3
    plain = GpuCapacityFactory()
    assert (plain.model, plain.mig_enabled, plain.layout) == ("H100-80GB", False, [])
    with pytest.raises(ValueError, match="does not fit"):
        GpuCapacityFactory(node=node, mig={"4g.71gb": 2})


def test_a_request_holds_its_items_and_the_decision_its_state_implies():
    submitted = PoolRequestFactory()
    assert submitted.state == RequestState.SUBMITTED and submitted.approved_at is None
    assert [(i.gpu_model, i.profile, i.count) for i in submitted.items.all()] == [("H100-80GB", "full", 1)]
    queued = PoolRequestFactory(
        state=RequestState.QUEUED, items=[("h200-141gb.mig-1g.18gb", 3), ("h100-80gb.full", 2)]
    )
    queued.full_clean()
    assert queued.approved_at and queued.decided_at == queued.approved_at
    assert [(i.gpu_model, i.profile, i.count) for i in queued.items.all()] == [
        ("H200-141GB", "1g.18gb", 3),
        ("H100-80GB", "full", 2),
    ]
    assert PoolRequestFactory(state=RequestState.REJECTED).decided_at is not None
    assert not PoolRequestFactory(items=[]).items.exists()


@pytest.mark.parametrize("state", PoolState.values)
def test_a_pool_is_billed_from_its_reservation_to_its_release(state):
    pool = PoolFactory(state=state)
    pool.full_clean()
    assert pool.request.state == RequestState.FULFILLED and pool.request.project == pool.project
    assert pool.reserved_at <= timezone.now()
    if state in (PoolState.RELEASED, PoolState.FAILED):
        assert pool.released_at >= pool.reserved_at
    else:
        assert pool.released_at is None
    assert (pool.active_at is not None) == (state in ("active", "reclaiming", "releasing", "released"))
    assert (pool.reclaim_at is not None) == (state == "reclaiming")


def test_a_pool_takes_the_times_and_project_it_is_given():
    start = timezone.now() - timedelta(days=3)
    pool = PoolFactory(state=PoolState.RELEASED, reserved_at=start, released_at=start + timedelta(hours=5))
    assert pool.released_at - pool.reserved_at == timedelta(hours=5)
    old = PoolFactory(state=PoolState.RELEASED, reserved_at=start)
    assert start < old.released_at <= timezone.now()
    acme = PoolFactory(project__tenant__slug="acme")
    assert acme.project.tenant.slug == "acme" and acme.request.project == acme.project
    request = PoolRequestFactory(state=RequestState.FULFILLED)
    assert PoolFactory(request=request, project=request.project).request == request
    with pytest.raises(ValueError, match="project"):
        PoolFactory(request=PoolRequestFactory(state=RequestState.FULFILLED), project=ProjectFactory())


def test_allocations_made_on_one_gpu_never_share_a_slice():
    pool = PoolFactory()
    gpu = GpuCapacityFactory(node__cluster=pool.cluster, node__gpu_model="H200-141GB", mig={"1g.18gb": 7})
    made = [AllocationFactory(pool=pool, gpu=gpu, profile="1g.18gb") for _ in range(7)]
    for allocation in made:
        allocation.full_clean()  # the exclusion constraint's own check included
    assert sorted(a.slices.lower for a in made) == list(range(7))
    assert {a.instance_uuid for a in made} == {i["uuid"] for i in gpu.layout}
    assert {a.resource_name for a in made} == {"nvidia.com/mig-1g.18gb"}
    with pytest.raises(ValueError, match=r"No free 1g\.18gb"):
        AllocationFactory(pool=pool, gpu=gpu, profile="1g.18gb")


def test_a_gpu_without_a_layout_is_carved_at_the_starts_the_catalogue_allows():
    gpu = GpuCapacityFactory(node__gpu_model="H200-141GB")
    first, second = (AllocationFactory(gpu=gpu, profile="3g.71gb") for _ in range(2))
    assert (first.slices, second.slices) == (NumericRange(0, 4), NumericRange(4, 8))
    assert first.pool.cluster == gpu.node.cluster and first.pool != second.pool


def test_a_full_gpu_is_held_once_until_it_is_released():
    taken = AllocationFactory()
    assert taken.profile == "full" and taken.slices == NumericRange(0, 8)
    assert taken.gpu.node.cluster == taken.pool.cluster and taken.instance_uuid == taken.gpu.uuid
    with pytest.raises(ValueError, match="No free full"):
        AllocationFactory(pool=taken.pool, gpu=taken.gpu)
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationFactory(pool=taken.pool, gpu=taken.gpu, slices=NumericRange(0, 8))
    gone = AllocationFactory(pool=PoolFactory(state=PoolState.RELEASED, cluster=taken.gpu.node.cluster))
    assert gone.released_at == gone.pool.released_at
    Allocation.objects.filter(pk=taken.pk).update(released_at=timezone.now())
    again = AllocationFactory(gpu=taken.gpu)
    assert again.slices == NumericRange(0, 8) and again.released_at is None
    with pytest.raises(ValueError, match="cluster"):
        AllocationFactory(pool=PoolFactory(), gpu=taken.gpu)


def test_a_cluster_keeps_its_kubeconfig_encrypted():
    cluster = ClusterFactory(driver="kubernetes", kubeconfig="apiVersion: v1\n")
    cluster.refresh_from_db()
    assert cluster.kubeconfig() == "apiVersion: v1\n" and "apiVersion" not in cluster.kubeconfig_encrypted
