"""A pool's life after admission: MIG changes, namespace and quota, active, release — and failures."""

import pytest

from pools.drivers.simulated import SimulatedDriver
from pools.models import Allocation, GpuCapacity, Pool, PoolState, SpecAndCount
from pools.services import admit_waiting, approve_request, finish_release, provision_step, submit_request
from pools.services.provisioning import DONE, FAILED, WAITING
from pools.sync import sync_cluster
from portal.errors import InvalidInput
from portal.models import Project


@pytest.fixture
def fleet(sim_cluster):
    sync_cluster(cluster=sim_cluster)
    return sim_cluster


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
