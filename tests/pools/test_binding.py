"""A pool's namespace bound to what it holds, and the trespass alarm, on the simulated cluster: the
namespace's nodes for the admission policy, its pods kept there, a foreign pod or claim seen, alerted and
shown until it leaves."""

from datetime import timedelta

import pytest
from django.utils import timezone

from monitoring.alerts.services import evaluate
from monitoring.models.alerts import Alert, AlertRule, RuleKind
from pools.drivers import admission
from pools.drivers.base import DeviceClaim, driver_for
from pools.models import Allocation, Trespass
from pools.services.inventory import sync_inventory
from pools.services.provisioning import finish_release, release_pool
from tests.pools.conftest import active_pool

MIG = [("h200-141gb.mig-1g.18gb", 2)]


def simulated_state(cluster):
    cluster.simulation.refresh_from_db()
    return cluster.simulation.state


def edit_state(cluster, change):
    state = simulated_state(cluster)
    change(state)
    cluster.simulation.save()


def add_pod(cluster, namespace, name, node, resources, claims=()):
    pod = {"namespace": namespace, "name": name, "node": node, "phase": "Running", "resources": resources}
    edit_state(cluster, lambda state: state["pods"].append({**pod, "claims": list(claims)}))


def remove_pod(cluster, name):
    edit_state(cluster, lambda state: state.update(pods=[p for p in state["pods"] if p["name"] != name]))


@pytest.fixture
def pool(fleet, tenancy, approver):
    return active_pool(tenancy.vision, tenancy.acme_member, approver, MIG)


def test_the_namespace_is_told_its_nodes_and_its_pods_stay_there(pool, fleet, tenancy):
    node = Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True).first()
    found = simulated_state(fleet)["namespaces"][tenancy.vision.namespace]
    assert found["annotations"] == {
        admission.BINDING_ANNOTATION: "device-plugin",
        admission.NODES_ANNOTATION: node,
    }
    pods = [p for p in simulated_state(fleet)["pods"] if p["namespace"] == tenancy.vision.namespace]
    assert len(pods) == 2 and {p["node"] for p in pods} == {node}


def test_a_foreign_pod_on_the_pools_node_is_a_trespass_alerted_shown_and_cleared(
    pool, fleet, tenancy, client, settings
):
    node = Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True).first()
    sync_inventory(cluster=fleet)
    assert not Trespass.objects.exists()  # the pool's own pods hold what it holds

    add_pod(fleet, "research", "sneaky-0", node, {"nvidia.com/mig-1g.18gb": 1})
    sync_inventory(cluster=fleet)
    (found,) = Trespass.objects.filter(ended_at__isnull=True)
    assert (found.namespace, found.node.name, found.resource_name, found.count) == (
        "research",
        node,
        "nvidia.com/mig-1g.18gb",
        1,
    )
    assert found.users == "pod sneaky-0"

    AlertRule.objects.filter(kind=RuleKind.TRESPASS).update(duration_seconds=0)
    evaluate(now=timezone.now() + timedelta(seconds=1))
    (alert,) = Alert.objects.open().filter(rule__kind=RuleKind.TRESPASS)
    assert alert.node_id == found.node_id and "research" in alert.message

    client.force_login(tenancy.acme_member)
    page = client.get(f"/t/{tenancy.acme.slug}/pools/{pool.pk}/").content.decode()
    assert 'id="trespasses"' in page and "sneaky-0" in page

    remove_pod(fleet, "sneaky-0")
    sync_inventory(cluster=fleet)
    assert Trespass.objects.get(pk=found.pk).ended_at is not None
    evaluate(now=timezone.now() + timedelta(seconds=2))
    assert not Alert.objects.open().filter(rule__kind=RuleKind.TRESPASS).exists()
    page = client.get(f"/t/{tenancy.acme.slug}/pools/{pool.pk}/").content.decode()
    assert 'id="trespasses"' not in page


def test_a_namespace_using_more_than_its_pools_hold_on_a_node_trespasses_by_the_difference(
    pool, fleet, tenancy
):
    node = Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True).first()
    add_pod(fleet, tenancy.vision.namespace, "extra-0", node, {"nvidia.com/mig-1g.18gb": 2})
    sync_inventory(cluster=fleet)
    (found,) = Trespass.objects.filter(ended_at__isnull=True)
    assert (found.namespace, found.count) == (tenancy.vision.namespace, 2)


def test_the_pool_page_and_api_show_the_projects_gpu_pods_and_what_each_may_use(pool, fleet, tenancy, client):
    sync_inventory(cluster=fleet)
    client.force_login(tenancy.acme_member)
    page = client.get(f"/t/{tenancy.acme.slug}/pools/{pool.pk}/").content.decode()
    assert 'id="gpu-pods"' in page and "mig-1g-18gb-worker-0" in page
    body = client.get(f"/api/v1/pools/{pool.pk}/").json()
    ids = sorted(a["id"] for a in body["allocations"])
    assert [(p["name"], p["exact"], sorted(p["allocations"])) for p in body["pods"]] == [
        ("mig-1g-18gb-worker-0", False, ids),
        ("mig-1g-18gb-worker-1", False, ids),
    ]
    assert all(a["claim"] == "" for a in body["allocations"])  # the device plugin binds this cluster
    listed = client.get("/api/v1/pools/").json()["results"][0]
    assert "pods" not in listed  # only a pool's own answer reads its pods


@pytest.fixture
def dra_fleet(fleet):
    edit_state(fleet, lambda state: state.update(dra=True))
    sync_inventory(cluster=fleet)
    fleet.refresh_from_db()
    assert fleet.binding == "dra"
    return fleet


def test_under_dra_each_device_gets_its_claim_and_a_release_deletes_them(
    dra_fleet, tenancy, approver, client
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, MIG)
    live = list(Allocation.objects.filter(pool=pool).order_by("pk"))
    claims = simulated_state(dra_fleet)["claims"]
    assert sorted((c["name"], c["uuid"], c["whole_gpu"]) for c in claims) == sorted(
        (f"gpu-portal-{pool.pk}-{a.pk}", a.instance_uuid, False) for a in live
    )
    assert all(a.instance_uuid.startswith("MIG-") for a in live)
    client.force_login(tenancy.acme_member)
    page = client.get(f"/t/{tenancy.acme.slug}/pools/{pool.pk}/").content.decode()
    assert "resourceClaimName: gpu-portal-" in page and "claims:\n          - name: gpu-0" in page
    assert [a["claim"] for a in client.get(f"/api/v1/pools/{pool.pk}/").json()["allocations"]] == [
        f"gpu-portal-{pool.pk}-{a.pk}" for a in live
    ]

    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    finish_release(pool_id=pool.pk)
    assert simulated_state(dra_fleet)["claims"] == []


def test_under_dra_a_claim_of_another_namespace_on_a_pools_device_is_a_trespass_on_that_pool(
    dra_fleet, tenancy, approver
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, MIG)
    taken = Allocation.objects.filter(pool=pool).order_by("pk").first()
    edit_state(
        dra_fleet,
        lambda state: state["namespaces"].setdefault("research", {"labels": {}}),
    )
    driver_for(dra_fleet).apply_claims("research", "", [DeviceClaim("grab", taken.instance_uuid, False)])
    sync_inventory(cluster=dra_fleet)
    (found,) = Trespass.objects.filter(ended_at__isnull=True)
    assert (found.namespace, found.device_uuid, found.pool_id, found.users) == (
        "research",
        taken.instance_uuid,
        pool.pk,
        "claim grab",
    )
