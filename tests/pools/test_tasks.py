"""Background sync: beat queues the clusters that are due, a real worker syncs them through Redis."""

import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from pools.models import NodeCapacity
from pools.services.inventory import sync_lock
from pools.tasks import sync_all_clusters, sync_cluster_now
from tests.factories import ClusterFactory

from .conftest import SMALL_FLEET


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_beat_queues_due_clusters_and_the_worker_syncs_them(celery_worker):
    due = ClusterFactory(name="due", fleet=SMALL_FLEET)
    later = ClusterFactory(name="later", fleet=SMALL_FLEET)
    later.next_sync_at = timezone.now() + timedelta(hours=1)  # backing off after failures
    later.save()
    assert sync_all_clusters() == 1
    deadline = time.monotonic() + 30
    while NodeCapacity.objects.filter(cluster=due).count() < 3:
        assert time.monotonic() < deadline, "the worker did not sync the cluster"
        time.sleep(0.2)
    assert not NodeCapacity.objects.filter(cluster=later).exists()


def test_a_cluster_is_never_synced_twice_at_once(sim_cluster):
    with sync_lock(sim_cluster.pk) as held:
        assert held
        assert sync_cluster_now(sim_cluster.pk) == "another sync of this cluster is running"
        assert not NodeCapacity.objects.exists()
    assert "nodes new 3" in sync_cluster_now(sim_cluster.pk)


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_whole_flow_through_the_api_with_a_real_worker(celery_worker, tenancy, staff_user):
    from rest_framework.test import APIClient

    from pools.services.inventory import sync_inventory

    cluster = ClusterFactory(name="flow", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    member, approver = APIClient(), APIClient()
    member.force_authenticate(tenancy.acme_member)
    approver.force_authenticate(staff_user("approver"))
    asked = member.post(
        "/api/v1/pool-requests/",
        {"project": tenancy.vision.pk, "items": [{"spec": "h200-141gb.mig-4g.71gb", "count": 1}]},
        format="json",
    ).json()
    assert (
        approver.post(f"/api/v1/pool-requests/{asked['id']}/approve/", {}, format="json").status_code == 200
    )

    def pool_state():
        found = member.get(f"/api/v1/pool-requests/{asked['id']}/").json()["pool"]
        return found and member.get(f"/api/v1/pools/{found}/").json()["state"]

    deadline = time.monotonic() + 60
    while (
        pool_state() != "active"
    ):  # the worker admits, re-partitions (simulated MIG manager), opens the quota
        assert time.monotonic() < deadline, f"pool is {pool_state()!r}; see {celery_worker.log}"
        time.sleep(0.3)
    pool = member.get(f"/api/v1/pool-requests/{asked['id']}/").json()["pool"]
    shown = member.get(f"/api/v1/pools/{pool}/").json()
    assert [a["profile"] for a in shown["allocations"]] == ["4g.71gb"]
    assert shown["allocations"][0]["instance_uuid"].startswith("MIG-")
    cluster.simulation.refresh_from_db()
    assert cluster.simulation.state["quotas"]["acme-vision"] == {"nvidia.com/mig-4g.71gb": 1}

    assert member.post(f"/api/v1/pools/{pool}/release/").status_code == 200
    while member.get(f"/api/v1/pools/{pool}/").json()["state"] != "released":
        assert time.monotonic() < deadline + 30, "the release did not finish"
        time.sleep(0.3)
    cluster.simulation.refresh_from_db()
    assert "acme-vision" not in cluster.simulation.state["quotas"]


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_worker_killed_half_way_leaves_provisioning_to_the_next_one(
    tenancy, staff_user, tmp_path, monkeypatch
):
    """acks_late: a provisioning task whose worker process dies is delivered again and finishes once."""
    import signal
    import subprocess
    import uuid
    from types import SimpleNamespace

    from django.db import transaction

    from pools.drivers.simulated import SimulatedDriver
    from pools.models import Pool
    from pools.services import admit_waiting, approve_request, submit_request
    from pools.services import queue as queue_service
    from pools.services.inventory import sync_inventory
    from pools.tasks import provision_pool
    from tests.conftest import running_worker

    cluster = ClusterFactory(name="slow", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 2)])
    approver = staff_user("approver")
    SimulatedDriver(cluster).set_latency(1.5)  # every cluster call takes a while: room to die half-way
    queue = f"death-{uuid.uuid4().hex[:8]}"
    # admission sends the provisioning task to this test's own worker, not to the session's
    to_this_worker = SimpleNamespace(
        after_commit=lambda task, pool_id: transaction.on_commit(
            lambda: provision_pool.apply_async(args=[pool_id], queue=queue)
        ),
    )
    monkeypatch.setattr(queue_service, "dispatch", to_this_worker)
    with running_worker(queue, tmp_path, pool="prefork") as worker:
        # Admitted in the approval's transaction: the queue run that approval asks for (the
        # session's worker may be up) finds nothing to admit, so the task goes to this worker.
        with transaction.atomic():
            approve_request(request_id=request.pk, approver=approver)
            admit_waiting()
        pool = Pool.objects.get(request=request)
        deadline = time.monotonic() + 30
        while "provision_pool[" not in worker.log.read_text():  # received (the banner lists its name)
            assert time.monotonic() < deadline, worker.log.read_text()
            time.sleep(0.1)
        time.sleep(0.5)  # inside the first slow cluster call
        children = subprocess.run(["pgrep", "-P", str(worker.process.pid)], capture_output=True, text=True)
        for pid in children.stdout.split():
            os.kill(int(pid), signal.SIGKILL)  # like the kernel's OOM killer
        while Pool.objects.get(pk=pool.pk).state != "active":
            assert time.monotonic() < deadline + 60, worker.log.read_text()
            time.sleep(0.3)
        log = worker.log.read_text()
    assert "SIGKILL" in log or "signal 9" in log
    pool.refresh_from_db()
    assert pool.events.filter(to_state="active").count() == 1
    assert pool.allocations.filter(released_at=None).count() == 2
    cluster.simulation.refresh_from_db()
    assert cluster.simulation.state["quotas"]["acme-vision"] == {"nvidia.com/gpu": 2}


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_crash_in_the_worker_ends_provisioning_and_release_cleanly(celery_worker, tenancy, staff_user):
    """The cluster answers with something the portal cannot handle (not a driver error): the real
    worker fails the pool being provisioned, and releases the pool being released, saying why."""
    from pools.models import Allocation, Pool, PoolState, SpecAndCount
    from pools.services import admit_waiting, approve_request, release_pool, submit_request
    from pools.services.inventory import sync_inventory

    cluster = ClusterFactory(name="crash", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    approver = staff_user("approver")

    def pool_of(items):
        request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items)
        approve_request(request_id=request.pk, approver=approver)
        admit_waiting()  # the worker provisions it
        return Pool.objects.get(request=request)

    def settled(pool, state):
        deadline = time.monotonic() + 60
        while Pool.objects.get(pk=pool.pk).state != state:
            assert time.monotonic() < deadline, celery_worker.log.read_text()
            time.sleep(0.3)
        pool.refresh_from_db()
        return pool

    kept = settled(pool_of([("h100-80gb.full", 1)]), PoolState.ACTIVE)

    def break_quotas():  # the simulated cluster loses its quota table: a KeyError inside the driver
        cluster.simulation.refresh_from_db()
        del cluster.simulation.state["quotas"]
        cluster.simulation.save()

    break_quotas()
    failed = settled(pool_of([("h100-80gb.full", 2)]), PoolState.FAILED)
    assert "KeyError" in failed.failure_reason
    assert list(failed.events.values_list("to_state", flat=True)) == ["provisioning", "failed"]
    assert not Allocation.objects.filter(pool=failed, released_at=None).exists()

    release_pool(pool_id=kept.pk, user=tenancy.acme_member)
    released = settled(kept, PoolState.RELEASED)
    assert "KeyError" in released.events.get(to_state="released").reason
    assert not Allocation.objects.filter(released_at=None).exists()
    assert not SpecAndCount.objects.filter(allocated__gt=0).exists()
    assert "Traceback" in celery_worker.log.read_text()
