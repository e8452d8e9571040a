"""Re-placing a pool: its instances on drained or unhealthy GPUs move to healthy capacity in one action,
with the queue's engine and rules, provisioning's way of settling new GPUs, and billing unbroken."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.conf import settings as billing_settings
from pools import conf
from pools.drivers.simulated import SimulatedDriver
from pools.models import Allocation, GpuCapacity, Pool, PoolEvent, PoolState, SpecAndCount
from pools.services import (
    admit_waiting,
    approve_request,
    release_pool,
    set_gpu_drained,
    submit_request,
)
from pools.services.deadlines import sweep_stuck_pools
from pools.services.inventory import sync_inventory
from pools.services.provisioning import DONE, FAILED, WAITING
from pools.services.replacement import replace, replaceable, settle_move
from pools.task_names import SETTLE_MOVE
from portal.dispatch import Send
from portal.errors import Conflict
from tests.factories import ClusterFactory

from .conftest import SMALL_FLEET, active_pool


def live(pool) -> list[Allocation]:
    return list(
        Allocation.objects.filter(pool=pool, released_at=None).select_related("gpu__node").order_by("pk")
    )


def sent(callbacks) -> list[Send]:
    """The tasks a transaction sends on commit (other callbacks, e.g. cache bumps, left out)."""
    return [c for c in callbacks if isinstance(c, Send)]


def settled(pool) -> str:
    outcome = WAITING
    for _step in range(5):
        outcome = settle_move(pool_id=pool.pk)
        if outcome != WAITING:
            break
    return outcome


def test_one_call_moves_the_instances_off_a_drained_gpu_and_leaves_other_tenants_alone(
    fleet, tenancy, approver, django_capture_on_commit_callbacks
):
    theirs = active_pool(tenancy.recsys, tenancy.globex_member, approver, [("h200-141gb.mig-1g.18gb", 3)])
    ours = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-1g.18gb", 2)])
    (shared,) = {a.gpu for a in live(theirs)}
    assert {a.gpu for a in live(ours)} == {shared}  # free instances of a GPU in use come first
    layout_before = GpuCapacity.objects.get(pk=shared.pk).layout
    theirs_before = [(a.pk, a.gpu_id, a.slices) for a in live(theirs)]
    set_gpu_drained(gpu=shared, drained=True)

    verdict = replaceable(ours)
    assert verdict.needed and verdict.fits and len(verdict.moves) == 2
    with django_capture_on_commit_callbacks() as callbacks:
        replace(pool=ours, actor=approver)
    assert sent(callbacks) == [Send(SETTLE_MOVE, (ours.pk,))]

    moved = live(ours)
    assert len(moved) == 2 and all(a.gpu.schedulable and a.gpu_id != shared.pk for a in moved)
    for allocation in moved:  # provisioned instances of the GPU's layout, as it was
        assert {"profile": "1g.18gb", "start": allocation.slices.lower} in [
            {"profile": i["profile"], "start": i["start"]} for i in allocation.gpu.layout
        ]
    assert [(a.pk, a.gpu_id, a.slices) for a in live(theirs)] == theirs_before  # the other tenant runs on
    assert GpuCapacity.objects.get(pk=shared.pk).layout == layout_before
    assert not GpuCapacity.objects.exclude(planned_layout=None).exists()  # provisioned instances, no re-cut
    old = Allocation.objects.filter(pool=ours).exclude(released_at=None)
    assert {a.gpu_id for a in old} == {shared.pk}
    assert {a.released_at for a in old} == {a.allocated_at for a in moved}  # one instant, end to start
    assert SpecAndCount.objects.get(node=shared.node, resource_name="nvidia.com/mig-1g.18gb").allocated == 3
    event = PoolEvent.objects.filter(pool=ours).last()
    assert (event.actor, event.from_state, event.to_state) == (approver, "active", "active")
    assert event.reason.count("→") == 2 and f"GPU {shared.index}" in event.reason

    assert settled(ours) == DONE
    assert all(a.instance_uuid.startswith("MIG-") for a in live(ours))
    ours.refresh_from_db()
    assert ours.state == PoolState.ACTIVE
    assert not replaceable(ours).needed


def test_a_move_that_re_partitions_is_settled_like_provisioning(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-2g.35gb", 1)])
    (before,) = live(pool)
    set_gpu_drained(gpu=before.gpu, drained=True)

    replace(pool=pool, actor=approver)
    (after,) = live(pool)
    target = GpuCapacity.objects.get(pk=after.gpu_id)
    assert target.planned_layout is not None and target.pk != before.gpu_id  # a wholly free GPU, re-cut
    set_gpu_drained(gpu=target, drained=True)
    assert "still being set up" in replaceable(pool).reason  # no second move while the first is under way
    set_gpu_drained(gpu=target, drained=False)

    assert settle_move(pool_id=pool.pk) == WAITING  # the MIG change is asked for
    pool.refresh_from_db()
    assert SimulatedDriver(fleet).mig_state(target.node.name).config == pool.mig_configs[target.node.name]
    assert settle_move(pool_id=pool.pk) == DONE
    (after,) = live(pool)
    assert after.gpu.schedulable and after.instance_uuid.startswith("MIG-")
    assert GpuCapacity.objects.get(pk=target.pk).planned_layout is None
    fleet.simulation.refresh_from_db()
    assert fleet.simulation.state["quotas"]["acme-vision"] == {"nvidia.com/mig-2g.35gb": 1}
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE
    assert settle_move(pool_id=pool.pk) == DONE  # a repeated step changes nothing


def test_without_room_it_refuses_in_the_engines_words_and_changes_nothing(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 8)])
    set_gpu_drained(gpu=live(pool)[3].gpu, drained=True)

    def state():
        return (
            sorted(Allocation.objects.values_list("pk", "gpu_id", "released_at")),
            PoolEvent.objects.count(),
            list(GpuCapacity.objects.exclude(planned_layout=None)),
        )

    before = state()
    verdict = replaceable(pool)
    assert verdict.needed and not verdict.fits
    with pytest.raises(Conflict) as refused:
        replace(pool=pool, actor=approver)
    assert refused.value.message == verdict.reason
    assert "No room" in verdict.reason and "H100-80GB" in verdict.reason
    assert state() == before


def test_nothing_to_move_and_a_pool_still_provisioning_are_refused(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    with pytest.raises(Conflict, match="healthy GPU"):
        replace(pool=pool, actor=approver)
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    waiting = Pool.objects.get(request=request)
    set_gpu_drained(gpu=live(waiting)[0].gpu, drained=True)
    with pytest.raises(Conflict, match="only an active pool"):
        replace(pool=waiting, actor=approver)


def test_an_unhealthy_gpu_as_the_cluster_reports_it_is_left_too(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    (before,) = live(pool)
    SimulatedDriver(fleet).set_gpu_health(before.gpu.node.name, before.gpu.index, "failed")
    sync_inventory(cluster=fleet)
    assert replaceable(pool).fits

    replace(pool=pool, actor=approver)
    (after,) = live(pool)
    assert after.gpu_id != before.gpu_id and after.gpu.health == "ok"
    assert settled(pool) == DONE
    assert after.gpu.uuid == Allocation.objects.get(pk=after.pk).instance_uuid


def test_billing_runs_on_without_gap_or_overlap_across_the_move(fleet, tenancy, approver):
    from billing.metering import whole_seconds
    from billing.models import UsageRecord
    from billing.services import meter

    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 2)])
    reserved = (timezone.now() - timedelta(hours=2, minutes=17, seconds=5)).replace(microsecond=0)
    Pool.objects.filter(pk=pool.pk).update(reserved_at=reserved)
    Allocation.objects.filter(pool=pool).update(allocated_at=reserved)
    set_gpu_drained(gpu=live(pool)[0].gpu, drained=True)
    replace(pool=pool, actor=approver)
    settled(pool)
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    pool.refresh_from_db()

    period = billing_settings.METERING_PERIOD_SECONDS
    meter(now=pool.released_at + timedelta(seconds=period + billing_settings.METERING_DELAY_SECONDS + 1))
    lifetime = whole_seconds(pool.released_at) - whole_seconds(pool.reserved_at)
    billed = sum(UsageRecord.objects.filter(pool=pool).values_list("seconds", flat=True))
    assert billed == 2 * lifetime  # two GPUs, every second of the pool's life once
    held = sum((a.released_at - a.allocated_at).total_seconds() for a in Allocation.objects.filter(pool=pool))
    assert held == pytest.approx(2 * (pool.released_at - pool.reserved_at).total_seconds())
    assert Allocation.objects.filter(pool=pool).count() == 3  # one moved: its old and new allocation


def test_a_failed_mig_change_gives_the_new_instance_back_and_a_second_move_brings_it(
    fleet, tenancy, approver, django_capture_on_commit_callbacks
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-2g.35gb", 1)])
    set_gpu_drained(gpu=live(pool)[0].gpu, drained=True)
    replace(pool=pool, actor=approver)
    (moving,) = live(pool)
    SimulatedDriver(fleet).set_next_outcome(moving.gpu.node.name, "failed")
    assert settle_move(pool_id=pool.pk) == WAITING
    assert settle_move(pool_id=pool.pk) == FAILED

    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE and live(pool) == []
    assert GpuCapacity.objects.get(pk=moving.gpu_id).planned_layout is None
    assert "did not finish" in PoolEvent.objects.filter(pool=pool).last().reason
    fleet.simulation.refresh_from_db()
    assert "acme-vision" not in fleet.simulation.state["quotas"]  # the namespace may not take it meanwhile
    verdict = replaceable(pool)
    assert verdict.needed and verdict.fits and verdict.moves[0].startswith("missing 2g.35gb")

    with django_capture_on_commit_callbacks() as callbacks:
        replace(pool=pool, actor=approver)
    assert sent(callbacks) == [Send(SETTLE_MOVE, (pool.pk,))]  # the quota takes the instance in again
    assert settled(pool) == DONE
    (back,) = live(pool)
    assert back.gpu.schedulable and back.instance_uuid.startswith("MIG-")
    fleet.simulation.refresh_from_db()
    assert fleet.simulation.state["quotas"]["acme-vision"] == {"nvidia.com/mig-2g.35gb": 1}


def test_the_sweeper_settles_again_a_move_left_in_flight(
    fleet, tenancy, approver, django_capture_on_commit_callbacks
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-2g.35gb", 1)])
    set_gpu_drained(gpu=live(pool)[0].gpu, drained=True)
    replace(pool=pool, actor=approver)
    with django_capture_on_commit_callbacks() as callbacks:
        assert sweep_stuck_pools().redriven == []  # not overdue yet
    assert sent(callbacks) == []
    long_ago = timezone.now() - timedelta(seconds=conf.settings.POOL_REDRIVE_SECONDS + 1)
    Allocation.objects.filter(pool=pool, released_at=None).update(allocated_at=long_ago)
    with django_capture_on_commit_callbacks() as callbacks:
        assert sweep_stuck_pools().redriven == [pool.pk]
        assert sweep_stuck_pools().redriven == []  # once per period
    assert sent(callbacks) == [Send(SETTLE_MOVE, (pool.pk,))]


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_real_worker_settles_the_move(celery_worker, tenancy, staff_user):
    cluster = ClusterFactory(name="move", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    approver = staff_user("approver")
    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-4g.71gb", 1)]
    )
    approve_request(request_id=request.pk, approver=approver)  # the worker admits and provisions

    def wait_for(check, what):
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline, f"{what}; see {celery_worker.log}"
            time.sleep(0.2)

    wait_for(lambda: Pool.objects.filter(request=request, state=PoolState.ACTIVE).exists(), "never active")
    pool = Pool.objects.get(request=request)
    (before,) = live(pool)
    set_gpu_drained(gpu=before.gpu, drained=True)
    replace(pool=pool, actor=approver)

    def moved():
        found = live(pool)
        return len(found) == 1 and found[0].instance_uuid and found[0].gpu.planned_layout is None

    wait_for(moved, "the move was not settled")
    (after,) = live(pool)
    assert after.gpu_id != before.gpu_id and after.gpu.schedulable
    assert Pool.objects.get(pk=pool.pk).state == PoolState.ACTIVE
