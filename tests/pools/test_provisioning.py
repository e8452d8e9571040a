"""A pool's life after admission: MIG changes, namespace and quota, active, release — and failures."""

import time

import pytest

from pools.drivers.simulated import SimulatedDriver
from pools.models import Allocation, GpuCapacity, Pool, PoolState, SpecAndCount
from pools.services import admit_waiting, approve_request, finish_release, provision_step, submit_request
from pools.services.provisioning import DONE, FAILED, WAITING
from portal.errors import InvalidInput
from portal.models import Project


def admitted(tenancy, approver, items) -> Pool:
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items)
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    return Pool.objects.get(request=request)


def simulated(cluster) -> dict:
    cluster.simulation.refresh_from_db()
    return cluster.simulation.state


def test_a_pool_with_a_new_mig_layout_becomes_active_and_is_released(fleet, tenancy, staff_user, api_for):
    pool = admitted(
        tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1), ("h200-141gb.mig-1g.18gb", 1)]
    )
    assert provision_step(pool_id=pool.pk) == WAITING  # the MIG change is asked for
    pool.refresh_from_db()
    ((node, config),) = pool.mig_configs.items()
    assert SimulatedDriver(fleet).mig_state(node).config == config
    assert provision_step(pool_id=pool.pk) == DONE
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE and pool.active_at
    assert all(a.instance_uuid.startswith(("MIG-", "GPU-")) for a in pool.allocations.all())
    assert not GpuCapacity.objects.exclude(planned_layout=None).exists()  # the cluster reached the plan
    state = simulated(fleet)
    assert "acme-vision" in state["namespaces"]
    assert state["quotas"]["acme-vision"] == {"nvidia.com/mig-4g.71gb": 1, "nvidia.com/mig-1g.18gb": 1}
    assert provision_step(pool_id=pool.pk) == DONE  # a repeated step changes nothing

    client = api_for(tenancy.acme_member)
    shown = client.get(f"/api/v1/pools/{pool.pk}/").json()
    assert shown["state"] == "active" and shown["namespace"] == "acme-vision"
    assert {a["profile"] for a in shown["allocations"]} == {"4g.71gb", "1g.18gb"}
    assert all(a["cluster"] == "sim" and a["gpu_uuid"] for a in shown["allocations"])

    released = client.post(f"/api/v1/pools/{pool.pk}/release/", format="json")
    assert released.status_code == 200 and released.json()["state"] == "releasing"
    assert not Allocation.objects.filter(pool=pool, released_at=None).exists()
    assert not SpecAndCount.objects.filter(allocated__gt=0).exists()
    assert finish_release(pool_id=pool.pk).state == PoolState.RELEASED
    assert "acme-vision" not in simulated(fleet)["quotas"]
    again = client.post(f"/api/v1/pools/{pool.pk}/release/", format="json")
    assert again.status_code == 409


def test_a_full_gpu_pool_needs_no_mig_change(fleet, tenancy, staff_user):
    pool = admitted(tenancy, staff_user("approver"), [("h100-80gb.full", 2)])
    assert provision_step(pool_id=pool.pk) == DONE
    assert simulated(fleet)["quotas"]["acme-vision"] == {"nvidia.com/gpu": 2}


def test_quota_covers_every_live_pool_of_the_project(fleet, tenancy, staff_user):
    approver = staff_user("approver")
    first = admitted(tenancy, approver, [("h100-80gb.full", 1)])
    provision_step(pool_id=first.pk)
    second = admitted(tenancy, approver, [("h100-80gb.full", 2)])
    provision_step(pool_id=second.pk)
    assert simulated(fleet)["quotas"]["acme-vision"] == {"nvidia.com/gpu": 3}


@pytest.mark.parametrize(("outcome", "message"), [("failed", "could not re-partition"), ("wedge", "stuck")])
def test_a_failed_mig_change_fails_the_pool_and_returns_its_capacity(
    outcome, message, fleet, tenancy, staff_user, settings
):
    settings.MIG_PENDING_TIMEOUT_SECONDS = 0
    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1)])
    gpu = GpuCapacity.objects.get(allocations__pool=pool)
    SimulatedDriver(fleet).set_next_outcome(gpu.node.name, outcome)
    assert provision_step(pool_id=pool.pk) == WAITING
    assert provision_step(pool_id=pool.pk) == FAILED
    pool.refresh_from_db()
    assert pool.state == PoolState.FAILED and message in pool.failure_reason
    assert not Allocation.objects.filter(released_at=None).exists()
    gpu.refresh_from_db()
    assert gpu.planned_layout is None
    assert "acme-vision" not in simulated(fleet)["quotas"]
    assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning", "failed"]


def test_only_the_asker_or_a_tenant_admin_releases(fleet, tenancy, staff_user, api_for):
    pool = admitted(tenancy, staff_user("approver"), [("h100-80gb.full", 1)])
    provision_step(pool_id=pool.pk)
    assert api_for(tenancy.acme_viewer).post(f"/api/v1/pools/{pool.pk}/release/").status_code == 403
    assert api_for(tenancy.globex_member).post(f"/api/v1/pools/{pool.pk}/release/").status_code == 404
    assert Pool.objects.get(pk=pool.pk).state == PoolState.ACTIVE
    assert api_for(tenancy.acme_admin).post(f"/api/v1/pools/{pool.pk}/release/").status_code == 200


def test_the_pool_list_runs_a_constant_number_of_queries(fleet, tenancy, staff_user, api_for):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    approver = staff_user("approver")
    admitted(tenancy, approver, [("h100-80gb.full", 1)])
    client = api_for(tenancy.acme_member)

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/api/v1/pools/").status_code == 200
        return len(ctx)

    queries()  # caches filled (the price table, among others)
    few = queries()
    for _ in range(4):
        admitted(tenancy, approver, [("h200-141gb.mig-1g.18gb", 2), ("h100-80gb.full", 1)])
    assert client.get("/api/v1/pools/").json()["count"] == 5
    assert queries() == few


def test_approvers_see_why_a_pool_failed_in_the_admin(fleet, tenancy, staff_user, client, settings):
    settings.MIG_PENDING_TIMEOUT_SECONDS = 0
    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1)])
    SimulatedDriver(fleet).set_next_outcome(
        GpuCapacity.objects.get(allocations__pool=pool).node.name, "failed"
    )
    provision_step(pool_id=pool.pk)
    provision_step(pool_id=pool.pk)
    client.force_login(staff_user("approver"))
    listing = client.get("/admin/pools/pool/?state__exact=failed").content.decode()
    assert "could not re-partition" in listing
    page = client.get(f"/admin/pools/pool/{pool.pk}/change/").content.decode()
    assert "could not re-partition" in page and "4g.71gb" in page


def test_late_or_duplicate_deliveries_are_harmless(fleet, tenancy, staff_user):
    from pools.tasks import finish_pool_release, provision_pool

    assert provision_pool.apply(args=[999999]).get() == FAILED  # a pool that is gone
    assert finish_pool_release.apply(args=[999999]).get() == "gone"
    pool = admitted(tenancy, staff_user("approver"), [("h100-80gb.full", 1)])
    assert provision_pool.apply(args=[pool.pk]).get() == DONE
    assert provision_pool.apply(args=[pool.pk]).get() == DONE  # delivered twice
    assert Pool.objects.get(pk=pool.pk).events.filter(to_state="active").count() == 1


def test_a_namespace_made_before_the_rules_gets_no_gpus(fleet, tenancy, staff_user):
    """A project whose namespace breaks the rules (kept from before them) is neither asked for GPUs
    nor provisioned: the namespace is never labelled or given a quota."""
    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.full", 1)])
    Project.objects.filter(pk=tenancy.vision.pk).update(namespace="monitoring")
    assert provision_step(pool_id=pool.pk) == FAILED
    pool.refresh_from_db()
    assert pool.state == PoolState.FAILED and "reserved" in pool.failure_reason
    assert "monitoring" not in simulated(fleet)["namespaces"]
    assert not Allocation.objects.filter(pool=pool, released_at=None).exists()

    tenancy.vision.refresh_from_db()
    with pytest.raises(InvalidInput, match="cannot go to this project's namespace"):
        submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.full", 1)])


# --- errors in a step: retried when transient, else the pool ends cleanly --------------------


def assert_failed_cleanly(pool: Pool, *words: str) -> None:
    pool.refresh_from_db()
    assert pool.state == PoolState.FAILED
    assert all(word in pool.failure_reason for word in words), pool.failure_reason
    assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning", "failed"]
    assert pool.events.get(to_state="failed").reason == pool.failure_reason  # the tenant's e-mail says it
    assert not Allocation.objects.filter(pool=pool, released_at=None).exists()
    # Billing stops when the capacity was given back: the pool's release time is the allocations'.
    freed = {a.released_at for a in Allocation.objects.filter(pool=pool)}
    assert pool.released_at is not None and freed <= {pool.released_at}
    assert pool.released_at >= pool.reserved_at
    assert not SpecAndCount.objects.filter(allocated__gt=0).exists()
    assert not GpuCapacity.objects.exclude(planned_layout=None).exists()


def test_an_integrity_error_mid_provisioning_is_retried_and_the_pool_completes(
    fleet, tenancy, staff_user, monkeypatch
):
    """A concurrent writer's row (the unique constraint said no): the step runs again and finds it."""
    from django.db import IntegrityError

    from pools.services import inventory
    from pools.tasks import provision_pool

    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1)])
    raised = []

    write = inventory.write_inventory

    def writes_meeting_a_concurrent_insert(*, cluster, **found):
        if not raised:
            raised.append(cluster)
            raise IntegrityError('duplicate key value violates unique constraint "spec_unique_on_node"')
        return write(cluster=cluster, **found)

    monkeypatch.setattr(inventory, "write_inventory", writes_meeting_a_concurrent_insert)
    assert provision_step(pool_id=pool.pk) == WAITING  # the MIG change is asked for
    with pytest.raises(IntegrityError):  # transient: raised for the task to retry
        provision_step(pool_id=pool.pk)
    assert Pool.objects.get(pk=pool.pk).state == PoolState.PROVISIONING
    raised.clear()
    assert provision_pool.apply(args=[pool.pk]).get() == DONE  # the task's retry gets past it
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE and pool.events.filter(to_state="active").count() == 1
    assert simulated(fleet)["quotas"]["acme-vision"] == {"nvidia.com/mig-4g.71gb": 1}


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("inventory", KeyError("layout")),
        ("ensure_namespace", ValueError("bad")),
        ("apply_quota", RuntimeError("quota")),
    ],
)
def test_a_crash_in_a_provisioning_step_fails_the_pool_cleanly(
    call, error, fleet, tenancy, staff_user, monkeypatch, caplog
):
    from pools.tasks import provision_pool

    pool = admitted(tenancy, staff_user("approver"), [("h200-141gb.mig-4g.71gb", 1), ("h100-80gb.full", 1)])
    assert provision_step(pool_id=pool.pk) == WAITING
    real = getattr(SimulatedDriver, call)

    def crash(self, *args, **kwargs):
        real(self, *args, **kwargs)  # the call reached the cluster, then the portal broke
        raise error

    monkeypatch.setattr(SimulatedDriver, call, crash)
    assert provision_pool.apply(args=[pool.pk]).get() == FAILED
    assert_failed_cleanly(pool, type(error).__name__, "unexpected")
    assert "Traceback" in caplog.text and f"pool {pool.pk}" in caplog.text  # the operators' details
    monkeypatch.undo()
    assert "acme-vision" not in simulated(fleet)["quotas"]  # a quota set before the crash is taken back
    assert provision_pool.apply(args=[pool.pk]).get() == FAILED  # a late delivery changes nothing
    assert pool.events.count() == 2


def test_a_lost_database_connection_is_retried_then_fails_the_pool_after_the_back_off(
    fleet, tenancy, staff_user, monkeypatch, settings
):
    from django.db import OperationalError

    from pools.tasks import provision_pool

    pool = admitted(tenancy, staff_user("approver"), [("h100-80gb.full", 1)])
    failures = []

    def lost(self, namespace, labels):
        failures.append(namespace)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(SimulatedDriver, "ensure_namespace", lost)
    with pytest.raises(OperationalError):
        provision_step(pool_id=pool.pk)
    assert Pool.objects.get(pk=pool.pk).state == PoolState.PROVISIONING  # to be retried, not failed
    settings.PROVISION_POLL_SECONDS, settings.SYNC_BACKOFF_MAX_SECONDS = 1, 3
    assert provision_pool.apply(args=[pool.pk]).get() == FAILED  # tries 1 + 4 retries, then gives up
    assert len(failures) == 1 + 5
    assert_failed_cleanly(pool, "OperationalError")


# --- errors in a release: retried, and in the end the pool is released anyway -----------------


def released_pool(fleet, tenancy, approver) -> Pool:
    from pools.services import release_pool

    pool = admitted(tenancy, approver, [("h100-80gb.full", 2)])
    assert provision_step(pool_id=pool.pk) == DONE
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    return Pool.objects.get(pk=pool.pk)


def assert_released_with(pool: Pool, *words: str) -> None:
    pool.refresh_from_db()
    assert pool.state == PoolState.RELEASED
    event = pool.events.get(to_state="released")
    assert all(word in event.reason for word in words), event.reason
    assert not Allocation.objects.filter(pool=pool, released_at=None).exists()
    # Billing stops when the capacity was given back: the pool's release time is the allocations'.
    freed = {a.released_at for a in Allocation.objects.filter(pool=pool)}
    assert pool.released_at is not None and freed <= {pool.released_at}
    assert pool.released_at >= pool.reserved_at
    assert not SpecAndCount.objects.filter(allocated__gt=0).exists()
    # billing stops when the capacity went back, not when the quota change was given up
    freed = {a.released_at for a in pool.allocations.all()}
    assert freed == {pool.released_at}


def test_a_crash_in_a_release_step_releases_the_pool_with_the_reason(
    fleet, tenancy, staff_user, monkeypatch, caplog
):
    from pools.tasks import finish_pool_release

    pool = released_pool(fleet, tenancy, staff_user("approver"))

    def crash(self, namespace):
        raise RuntimeError("boom")

    monkeypatch.setattr(SimulatedDriver, "remove_quota", crash)
    assert finish_pool_release.apply(args=[pool.pk]).get() == PoolState.RELEASED
    assert_released_with(pool, "RuntimeError", "could not be shrunk")
    assert "boom" not in pool.events.get(to_state="released").reason  # the log has it, not the tenant
    assert "Traceback" in caplog.text and "boom" in caplog.text
    assert finish_pool_release.apply(args=[pool.pk]).get() == PoolState.RELEASED  # delivered again
    assert pool.events.filter(to_state="released").count() == 1


def test_a_release_that_keeps_failing_is_retried_then_released(fleet, tenancy, staff_user):
    from pools.drivers.base import ClusterUnreachable
    from pools.tasks import finish_pool_release

    pool = released_pool(fleet, tenancy, staff_user("approver"))
    SimulatedDriver(fleet).set_reachable(False)
    with pytest.raises(ClusterUnreachable):  # retried by the task
        finish_release(pool_id=pool.pk)
    assert Pool.objects.get(pk=pool.pk).state == PoolState.RELEASING
    assert finish_pool_release.apply(args=[pool.pk]).get() == PoolState.RELEASED  # after its 20 retries
    assert_released_with(pool, "does not answer", "could not be shrunk")
    SimulatedDriver(fleet).set_reachable(True)
    assert simulated(fleet)["quotas"]["acme-vision"] == {"nvidia.com/gpu": 2}  # what the operators check


def test_a_finished_release_stops_billing_when_the_capacity_went_back(fleet, tenancy, staff_user):
    pool = released_pool(fleet, tenancy, staff_user("approver"))
    assert finish_release(pool_id=pool.pk).state == PoolState.RELEASED
    assert_released_with(pool)


def test_two_pools_re_partitioning_gpus_of_one_node_both_become_active(fleet, tenancy, staff_user, settings):
    """Admitted in one queue run, each pool asks for its node's change in turn, the second while the first
    is still pending: the second change keeps the first's layouts (the driver protocol's rule), and the
    first pool follows it instead of failing."""
    settings.SIMULATED_MIG_APPLY_SECONDS = 0.5
    approver = staff_user("approver")
    requests = [
        submit_request(
            project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-4g.71gb", 1)]
        )
        for _ in range(2)
    ]
    for request in requests:
        approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    first, second = (Pool.objects.get(request=request) for request in requests)
    assert provision_step(pool_id=first.pk) == WAITING
    assert provision_step(pool_id=second.pk) == WAITING
    first.refresh_from_db()
    second.refresh_from_db()
    assert set(first.mig_configs) == set(second.mig_configs)  # one node, two changes: what this is about
    (node,) = first.mig_configs
    assert first.mig_configs[node] != second.mig_configs[node]
    assert provision_step(pool_id=first.pk) == WAITING  # following the second change, still pending
    time.sleep(0.6)
    assert provision_step(pool_id=first.pk) == DONE
    assert provision_step(pool_id=second.pk) == DONE
    for pool in (first, second):
        pool.refresh_from_db()
        assert pool.state == PoolState.ACTIVE, pool.events.last().reason
        (allocation,) = pool.allocations.all()
        assert allocation.profile == "4g.71gb" and allocation.instance_uuid.startswith("MIG-")
    assert first.mig_configs == second.mig_configs  # the first followed the later change
    assert simulated(fleet)["quotas"]["acme-vision"] == {"nvidia.com/mig-4g.71gb": 2}
