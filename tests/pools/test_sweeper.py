"""The sweeper: pools in provisioning or releasing past a deadline are re-driven, then ended."""

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.utils import timezone

from pools import conf
from pools.models import Allocation, Pool, PoolState, SpecAndCount
from pools.services import (
    admit_waiting,
    approve_request,
    provision_step,
    release_pool,
    submit_request,
)
from pools.services.deadlines import sweep_stuck_pools
from pools.services.inventory import sync_inventory
from pools.services.provisioning import DONE
from portal import shell
from tests.factories import ClusterFactory

from .conftest import SMALL_FLEET

# The queue's way to Celery, losing every provisioning task it sends: only the sweeper knows the pool.
LOSING = SimpleNamespace(after_commit=lambda task, *args: None)


@pytest.fixture
def fleet(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    return sim_cluster


def admitted(tenancy, approver, items=(("h100-80gb.full", 2),)) -> Pool:
    """A pool whose provisioning task was lost: admitted, never provisioned.

    Admitted in the approval's transaction, so that the queue run approval asks for (a worker may
    be up) finds nothing to admit and provision behind the test's back."""
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=list(items))
    with transaction.atomic():
        approve_request(request_id=request.pk, approver=approver)
        admit_waiting()
    return Pool.objects.get(request=request)


def later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def past_redrive():
    return later(conf.settings.POOL_REDRIVE_SECONDS + 1)


def past_stuck():
    return later(conf.settings.POOL_STUCK_SECONDS + 1)


def test_the_deadlines_come_after_the_mig_timeout_and_beat_runs_the_sweeper():
    pools = conf.settings
    assert pools.MIG_PENDING_TIMEOUT_SECONDS < pools.POOL_REDRIVE_SECONDS < pools.POOL_STUCK_SECONDS
    sweeper = shell.beat_schedule()["sweep-stuck-pools"]
    assert sweeper == {"task": "pools.tasks.sweep_stuck_pools", "schedule": pools.POOL_SWEEP_SECONDS}


def test_pools_within_their_deadline_or_settled_are_left_alone(fleet, tenancy, staff_user):
    approver = staff_user("approver")
    young = admitted(tenancy, approver, [("h100-80gb.full", 1)])
    active = admitted(tenancy, approver, [("h100-80gb.full", 1)])
    assert provision_step(pool_id=active.pk) == DONE
    report = sweep_stuck_pools()
    assert (report.redriven, report.failed, report.released) == ([], [], [])
    report = sweep_stuck_pools(now=past_stuck())  # an active pool has no deadline
    assert active.pk not in report.redriven + report.failed + report.released
    assert young.pk in report.failed


def test_a_pool_past_the_first_deadline_is_redriven_once_a_period(fleet, tenancy, staff_user):
    pool = admitted(tenancy, staff_user("approver"))
    report = sweep_stuck_pools(now=past_redrive())
    assert report.redriven == [pool.pk] and report.failed == []
    assert sweep_stuck_pools(now=past_redrive()).redriven == []  # twice: the task is not piled up
    pool.refresh_from_db()
    assert pool.state == PoolState.PROVISIONING  # the task does the work, not the sweeper
    assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning"]


def test_a_pool_past_the_second_deadline_is_failed_with_its_capacity_returned(fleet, tenancy, staff_user):
    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1)])
    assert SpecAndCount.objects.filter(allocated__gt=0).exists()
    report = sweep_stuck_pools(now=past_stuck())
    assert report.failed == [pool.pk]
    pool.refresh_from_db()
    assert pool.state == PoolState.FAILED
    assert "did not finish within" in pool.failure_reason
    assert pool.events.get(to_state="failed").reason == pool.failure_reason  # the tenant is told why
    assert not Allocation.objects.filter(released_at=None).exists()
    assert not SpecAndCount.objects.filter(allocated__gt=0).exists()
    assert not pool.allocations.first().gpu.planned_layout  # the GPU may be planned again

    again = sweep_stuck_pools(now=past_stuck())  # running it twice changes nothing more
    assert (again.redriven, again.failed, again.released) == ([], [], [])
    assert pool.events.count() == 2
    assert provision_step(pool_id=pool.pk) != DONE  # a late task does not revive it


def test_a_release_past_its_deadlines_is_redriven_then_released(fleet, tenancy, staff_user):
    pool = admitted(tenancy, staff_user("approver"))
    assert provision_step(pool_id=pool.pk) == DONE
    Pool.objects.filter(pk=pool.pk).update(reserved_at=timezone.now() - timedelta(days=3))
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)  # its finishing task was lost
    assert sweep_stuck_pools().redriven == []  # the deadline counts from the release, not the reservation
    assert sweep_stuck_pools(now=past_redrive()).redriven == [pool.pk]

    report = sweep_stuck_pools(now=past_stuck())
    assert report.released == [pool.pk]
    pool.refresh_from_db()
    assert pool.state == PoolState.RELEASED
    assert "did not finish within" in pool.events.get(to_state="released").reason
    assert {a.released_at for a in pool.allocations.all()} == {pool.released_at}  # billing stopped at release
    again = sweep_stuck_pools(now=past_stuck())
    assert (again.redriven, again.failed, again.released) == ([], [], [])
    assert pool.events.filter(to_state="released").count() == 1


def test_the_sweeper_task_reports_what_it_did(fleet, tenancy, staff_user, settings):
    from pools.tasks import sweep_stuck_pools as task

    admitted(tenancy, staff_user("approver"))
    settings.POOL_STUCK_SECONDS = 0
    assert task.apply().get() == "0 re-driven, 1 failed, 0 released as stuck"
    assert task.apply().get() == "0 re-driven, 0 failed, 0 released as stuck"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_sweepers_at_once_end_a_stuck_pool_once(tenancy, staff_user, settings, monkeypatch):
    from pools.services import queue as queue_service

    monkeypatch.setattr(queue_service, "dispatch", LOSING)  # lost tasks
    cluster = ClusterFactory(name="sweep", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    approver = staff_user("approver")
    pools = [admitted(tenancy, approver, [("h100-80gb.full", 1)]) for _ in range(6)]
    settings.POOL_STUCK_SECONDS = 0
    start, reports, errors = threading.Barrier(2), [], []

    def sweeper():
        try:
            start.wait(10)
            reports.append(sweep_stuck_pools())
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(pk for report in reports for pk in report.failed) == sorted(p.pk for p in pools)
    for pool in pools:
        assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning", "failed"]
    assert not Allocation.objects.filter(released_at=None).exists()


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_pool_whose_task_was_lost_is_redriven_by_the_sweeper_and_becomes_active(
    celery_worker, tenancy, staff_user, monkeypatch
):
    """The worker died with the message (or the broker lost it): only the sweeper knows the pool."""
    from pools.services import queue as queue_service

    cluster = ClusterFactory(name="lost", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    monkeypatch.setattr(queue_service, "dispatch", LOSING)  # the lost message
    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1)])
    time.sleep(1)
    assert Pool.objects.get(pk=pool.pk).state == PoolState.PROVISIONING  # nothing drives it
    assert sweep_stuck_pools(now=past_redrive()).redriven == [pool.pk]
    deadline = time.monotonic() + 60
    while Pool.objects.get(pk=pool.pk).state != PoolState.ACTIVE:
        assert time.monotonic() < deadline, celery_worker.log.read_text()
        time.sleep(0.3)
    assert pool.events.filter(to_state="active").count() == 1
    cluster.simulation.refresh_from_db()
    assert cluster.simulation.state["quotas"]["acme-vision"] == {"nvidia.com/mig-4g.71gb": 1}
