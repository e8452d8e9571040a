"""Capacity for operators: dashboard and API, who may see them, and what they cost in queries."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pools.drivers.simulated import SimulatedDriver
from pools.models import GpuCapacity, NodeCapacity, SpecAndCount
from pools.selectors import capacity_summary
from pools.sync import sync_cluster
from tests.factories import ClusterFactory, UserFactory

from .conftest import FULL

STAFF_ONLY = [
    "/capacity/",
    "/api/v1/capacity/summary/",
    "/api/v1/capacity/nodes/",
    "/api/v1/capacity/gpus/",
]


@pytest.fixture
def synced(sim_cluster):
    sync_cluster(cluster=sim_cluster)
    return sim_cluster


@pytest.mark.parametrize("url", STAFF_ONLY)
@pytest.mark.parametrize(("group", "allowed"), [("operator", True), ("approver", True), ("finance", False)])
def test_capacity_is_for_operators_and_approvers(url, group, allowed, synced, staff_user, client):
    client.force_login(staff_user(group))
    response = client.get(url)
    assert response.status_code == (200 if allowed else (404 if url == "/capacity/" else 403))


@pytest.mark.parametrize("url", STAFF_ONLY)
def test_tenants_cannot_see_capacity(url, synced, tenancy, client):
    client.force_login(tenancy.acme_admin)
    assert client.get(url).status_code in (403, 404)


def test_everyone_sees_cluster_names_but_never_connection_details(synced, tenancy, api_for):
    synced.set_kubeconfig("apiVersion: v1\nusers: [{name: u, user: {token: s3cr3t-token}}]")
    synced.save()
    response = api_for(tenancy.acme_member).get("/api/v1/clusters/")
    assert response.status_code == 200
    assert response.json()["results"] == [
        {
            "name": "sim",
            "driver": "simulated",
            "status": "ready",
            "last_sync_at": response.json()["results"][0]["last_sync_at"],
        }
    ]
    assert b"s3cr3t" not in response.content
    assert api_for(tenancy.acme_member).get("/api/v1/clusters/sim/").json()["name"] == "sim"


def test_summary_counts_compute_slices(synced, staff_user, api_for):
    rows = api_for(staff_user("operator")).get("/api/v1/capacity/summary/").json()["results"]
    by_model = {row["model"]: row for row in rows}
    h200 = by_model["H200-141GB"]
    # two H200 nodes: per node one GPU of 7 × 1g (no stranding), one of 2 × 3g (1 stranded), six full
    assert (h200["gpus"], h200["mig_gpus"], h200["full_gpus"]) == (16, 4, 12)
    assert (h200["compute_total"], h200["compute_stranded"], h200["compute_allocated"]) == (112, 2, 0)
    assert h200["compute_free"] == 110
    SpecAndCount.objects.filter(node__name="h200-1", resource_name="nvidia.com/mig-3g.71gb").update(
        allocated=2
    )
    h200 = {
        r["model"]: r
        for r in api_for(staff_user("operator")).get("/api/v1/capacity/summary/").json()["results"]
    }["H200-141GB"]
    assert (h200["compute_allocated"], h200["compute_free"]) == (6, 104)


def test_drained_and_unhealthy_gpus_are_unschedulable(synced, staff_user, api_for):
    SimulatedDriver(synced).set_gpu_health("h100-1", 0, "failed")
    sync_cluster(cluster=synced)
    GpuCapacity.objects.filter(node__name="h100-1", index=1).update(drained=True)
    client = api_for(staff_user("operator"))
    gpus = client.get("/api/v1/capacity/gpus/?node=h100-1").json()["results"]
    assert [g["schedulable"] for g in gpus[:3]] == [False, False, True]
    row = {r["model"]: r for r in client.get("/api/v1/capacity/summary/").json()["results"]}["H100-80GB"]
    assert row["unschedulable_gpus"] == 2


def test_node_and_gpu_lists_filter_and_name_their_cluster(synced, staff_user, api_for):
    client = api_for(staff_user("operator"))
    nodes = client.get("/api/v1/capacity/nodes/?model=H100-80GB").json()["results"]
    assert [(n["cluster"], n["name"]) for n in nodes] == [("sim", "h100-1")]
    assert {s["profile"] for s in nodes[0]["specs"]} == {"full"}
    gpus = client.get("/api/v1/capacity/gpus/?cluster=sim&node=h200-1").json()["results"]
    assert len(gpus) == 8 and gpus[0]["model"] == "H200-141GB"
    assert gpus[1]["layout"] == [
        {"profile": "3g.71gb", "start": 0, "uuid": gpus[1]["layout"][0]["uuid"]},
        {"profile": "3g.71gb", "start": 4, "uuid": gpus[1]["layout"][1]["uuid"]},
    ]
    assert gpus[1]["compute_stranded"] == 1


def _queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx)


@pytest.mark.parametrize("url", STAFF_ONLY)
def test_capacity_pages_run_a_constant_number_of_queries(url, db, client):
    operator = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(operator)
    small = ClusterFactory(name="small", fleet=[("n", 1, "H200-141GB", [{"1g.18gb": 7}] + [None] * 7)])
    sync_cluster(cluster=small)
    few = _queries(client, url)
    # a 500-GPU fleet: 63 nodes of 8, mixed layouts, in a second cluster
    big = ClusterFactory(
        name="big",
        fleet=[("m", 31, "H200-141GB", [{"3g.71gb": 2}] * 4 + [None] * 4), ("f", 32, "H100-80GB", FULL)],
    )
    sync_cluster(cluster=big)
    assert GpuCapacity.objects.count() >= 500
    assert _queries(client, url) == few


def test_dashboard_draws_layouts_and_flags(synced, staff_user, client):
    NodeCapacity.objects.filter(name="h100-1").update(drained=True)
    client.force_login(staff_user("operator"))
    body = client.get("/capacity/").content.decode()
    assert body.count('class="gpu ') == 24
    assert "at-5 span-4" in body  # the second 3g.71gb starts at memory slice 4 and spans 4
    assert body.count("seg-1g") == 14  # two nodes with a GPU of 7 × 1g.18gb
    assert 'class="node drained"' in body
    assert reverse("capacity-dashboard") in client.get("/").content.decode()  # linked in the menu


def test_dashboard_names_the_projects_whose_pods_hold_gpus(synced, staff_user, client):
    from tests.factories import ProjectFactory

    ProjectFactory(slug="vision", namespace="acme-vision", tenant__slug="acme")
    driver = SimulatedDriver(synced)
    driver.ensure_namespace("acme-vision", {})
    driver.apply_quota("acme-vision", {"nvidia.com/mig-1g.18gb": 3})
    sync_cluster(cluster=synced)
    client.force_login(staff_user("operator"))
    body = client.get("/capacity/").content.decode()
    assert "acme/vision · 1g.18gb × 3" in body


def test_dashboard_colours_instances_by_the_project_holding_them(synced, tenancy, staff_user, client):
    from pools.services import admit_waiting, approve_request, submit_request

    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-1g.18gb", 2)]
    )
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    client.force_login(staff_user("operator"))
    body = client.get("/capacity/").content.decode()
    assert body.count("1g.18gb · acme/vision") == 2
    assert body.count("seg held holder-") == 2


def test_the_summary_reads_in_the_same_queries_for_a_bigger_fleet_and_agrees_with_each_gpu(synced):
    def summarise():
        with CaptureQueriesContext(connection) as captured:
            rows = capacity_summary()
        return rows, len(captured)

    _rows, queries = summarise()
    bigger = ClusterFactory(
        name="big", fleet=[("b", 6, "H200-141GB", [{"3g.71gb": 2}, {"1g.18gb": 7}] + [None] * 6)]
    )
    sync_cluster(cluster=bigger)
    rows, more_queries = summarise()

    assert more_queries == queries
    stranded = {}
    for gpu in GpuCapacity.objects.filter(present=True).select_related("node__cluster"):
        key = (gpu.node.cluster.name, gpu.model)
        stranded[key] = stranded.get(key, 0) + gpu.compute[1]
    assert {(r.cluster, r.model): r.compute_stranded for r in rows} == stranded
    assert {(r.cluster, r.model): r.gpus for r in rows}[("big", "H200-141GB")] == 48
