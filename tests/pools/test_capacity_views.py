"""Capacity for operators: dashboard and API, who may see them, and what they cost in queries."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pools.drivers.simulated import SimulatedDriver
from pools.models import Allocation, GpuCapacity, NodeCapacity, SpecAndCount
from pools.selectors import capacity_summary
from pools.services import set_node_group
from pools.services.inventory import sync_inventory
from tests.factories import ClusterFactory, GpuGroupFactory, UserFactory

from .conftest import FULL

STAFF_ONLY = [
    "/capacity/",
    "/api/v1/capacity/summary/",
    "/api/v1/capacity/nodes/",
    "/api/v1/capacity/gpus/",
]


@pytest.fixture
def synced(sim_cluster):
    sync_inventory(cluster=sim_cluster)
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
            "groups": [],
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
    sync_inventory(cluster=synced)
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
    sync_inventory(cluster=small)
    few = _queries(client, url)
    # a 500-GPU fleet: 63 nodes of 8, mixed layouts, in a second cluster
    big = ClusterFactory(
        name="big",
        fleet=[("m", 31, "H200-141GB", [{"3g.71gb": 2}] * 4 + [None] * 4), ("f", 32, "H100-80GB", FULL)],
    )
    sync_inventory(cluster=big)
    assert GpuCapacity.objects.count() >= 500
    assert _queries(client, url) == few


def group_url(cluster, group=None):
    return reverse("capacity-group", kwargs={"pk": cluster.pk, "group": group.pk if group else "none"})


def node_url(node):
    return reverse("capacity-node", kwargs={"pk": node.pk})


def test_the_overview_links_each_group_and_draws_no_gpu(synced, staff_user, client):
    training = GpuGroupFactory(cluster=synced, name="training")
    set_node_group(node=NodeCapacity.objects.get(name="h100-1"), group=training)
    client.force_login(staff_user("operator"))
    body = client.get("/capacity/").content.decode()
    assert 'class="gpu ' not in body and "seg-" not in body  # no GPU drawn at fleet level
    assert f'href="{group_url(synced, training)}"' in body
    assert f'href="{group_url(synced)}"' in body  # the nodes in no group
    assert body.count('<tr class="capacity-group">') == 2
    assert reverse("capacity-dashboard") in client.get("/", follow=True).content.decode()  # in the menu


def test_the_overview_lists_nodes_to_look_at_first_and_finds_them_by_name(db, staff_user, client):
    cluster = ClusterFactory(name="wide", fleet=[("w", 30, "H100-80GB", FULL)])
    sync_inventory(cluster=cluster)
    NodeCapacity.objects.filter(name="w-30").update(drained=True)
    GpuCapacity.objects.filter(node__name="w-29", index=3).update(health="failed")
    client.force_login(staff_user("operator"))
    body = client.get("/capacity/").content.decode()
    listed = re.findall(r'<a href="/capacity/nodes/\d+/">([^<]+)</a>', body)
    assert len(listed) == 25 and listed[:2] == ["w-29", "w-30"]  # paged; the troubled first
    second = client.get("/capacity/?page=2").content.decode()
    assert len(re.findall(r'<a href="/capacity/nodes/\d+/">', second)) == 5
    found = client.get("/capacity/?node=W-2").content.decode()
    names = re.findall(r'<a href="/capacity/nodes/\d+/">([^<]+)</a>', found)
    assert names[:1] == ["w-29"] and sorted(names) == sorted(["w-2", *(f"w-2{i}" for i in range(10))])
    assert "No node has this in its name." in client.get("/capacity/?node=nothing-like-it").content.decode()
    assert client.get("/capacity/?node=" + "x" * 300).status_code == 200  # longer than any node name
    assert client.get("/capacity/?node=" + "x" * 3000).status_code == 400  # refused before the view


def test_the_group_page_draws_exactly_its_nodes_layouts_and_flags(synced, staff_user, client):
    training = GpuGroupFactory(cluster=synced, name="training")
    set_node_group(node=NodeCapacity.objects.get(name="h100-1"), group=training)
    NodeCapacity.objects.filter(name="h100-1").update(drained=True)
    client.force_login(staff_user("operator"))
    ungrouped = client.get(group_url(synced)).content.decode()
    assert ungrouped.count('class="gpu ') == 16  # h200-1 and h200-2, not h100-1
    assert "h100-1" not in ungrouped
    assert "at-5 span-4" in ungrouped  # the second 3g.71gb starts at memory slice 4 and spans 4
    assert ungrouped.count("seg-1g") == 14  # two nodes with a GPU of 7 × 1g.18gb
    grouped = client.get(group_url(synced, training)).content.decode()
    assert grouped.count('class="gpu ') == 8 and "h200-1" not in grouped
    assert 'class="node drained"' in grouped
    assert f'href="{node_url(NodeCapacity.objects.get(name="h100-1"))}"' in grouped


def test_the_group_page_pages_its_nodes(db, staff_user, client):
    cluster = ClusterFactory(name="wide", fleet=[("w", 13, "H100-80GB", FULL)])
    sync_inventory(cluster=cluster)
    client.force_login(staff_user("operator"))
    first = client.get(group_url(cluster)).content.decode()
    second = client.get(group_url(cluster) + "?page=2").content.decode()
    assert first.count('<div class="node">') == 10 and second.count('<div class="node">') == 3
    shown = [re.findall(r"<strong>(w[^<]*)</strong>", page) for page in (first, second)]
    assert sorted(shown[0] + shown[1]) == sorted(NodeCapacity.objects.values_list("name", flat=True))
    assert "Page 2 of 2" in second
    # a page past the end or not a number shows a page of the list, as the project's lists do
    assert client.get(group_url(cluster) + "?page=99").content.decode().count('<div class="node">') == 3
    assert client.get(group_url(cluster) + "?page=x").status_code == 200


def test_the_node_page_draws_its_gpus_and_specs(synced, staff_user, client):
    node = NodeCapacity.objects.get(name="h200-1")
    client.force_login(staff_user("operator"))
    body = client.get(node_url(node)).content.decode()
    assert body.count('class="gpu ') == 8
    assert '<div class="gpus large">' in body
    assert "nvidia.com/mig-3g.71gb" in body  # its resources
    assert "h200-2" not in body and "h100-1" not in body
    for gpu in node.gpus.all():
        assert gpu.uuid in body


@pytest.mark.parametrize(
    "url",
    [
        lambda c, g: group_url(c, g).replace(f"/{g.pk}/", "/999999/"),  # no such group
        lambda c, g: reverse("capacity-group", kwargs={"pk": 999999, "group": "none"}),
        lambda c, g: reverse("capacity-group", kwargs={"pk": c.pk, "group": "training"}),  # not an id
        lambda c, g: reverse("capacity-group", kwargs={"pk": c.pk, "group": "-1"}),
        lambda c, g: reverse("capacity-node", kwargs={"pk": 999999}),
    ],
)
def test_unknown_groups_clusters_and_nodes_are_not_found(url, synced, staff_user, client):
    training = GpuGroupFactory(cluster=synced, name="training")
    other = ClusterFactory(name="other")
    client.force_login(staff_user("operator"))
    assert client.get(url(synced, training)).status_code == 404
    # a group is found only under its own cluster
    assert client.get(group_url(synced, training)).status_code == 200
    wrong = reverse("capacity-group", kwargs={"pk": other.pk, "group": training.pk})
    assert client.get(wrong).status_code == 404


@pytest.mark.parametrize("who", ["tenant admin", "tenant member", "finance", "outsider"])
def test_tenants_and_finance_get_404_on_every_capacity_page(who, synced, tenancy, staff_user, client):
    user = {
        "tenant admin": tenancy.acme_admin,
        "tenant member": tenancy.acme_member,
        "outsider": tenancy.outsider,
    }.get(who) or staff_user("finance")
    node = NodeCapacity.objects.get(name="h200-1")
    client.force_login(user)
    for url in ("/capacity/", group_url(synced), node_url(node)):
        response = client.get(url)
        assert response.status_code == 404
        assert b"h200-1" not in response.content


def test_the_group_page_names_the_projects_whose_pods_hold_gpus(synced, staff_user, client):
    from tests.factories import ProjectFactory

    ProjectFactory(slug="vision", namespace="acme-vision", tenant__slug="acme")
    driver = SimulatedDriver(synced)
    driver.ensure_namespace("acme-vision", {})
    driver.apply_quota("acme-vision", {"nvidia.com/mig-1g.18gb": 3})
    sync_inventory(cluster=synced)
    client.force_login(staff_user("operator"))
    body = client.get(group_url(synced)).content.decode()
    assert "acme/vision · 1g.18gb × 3" in body


def test_the_group_page_colours_instances_by_the_project_holding_them(synced, tenancy, staff_user, client):
    from pools.services import admit_waiting, approve_request, submit_request

    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-1g.18gb", 2)]
    )
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    client.force_login(staff_user("operator"))
    body = client.get(group_url(synced)).content.decode()
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
    sync_inventory(cluster=bigger)
    rows, more_queries = summarise()

    assert more_queries == queries
    stranded = {}
    for gpu in GpuCapacity.objects.filter(present=True).select_related("node__cluster"):
        key = (gpu.node.cluster.name, gpu.model)
        stranded[key] = stranded.get(key, 0) + gpu.compute[1]
    assert {(r.cluster, r.model): r.compute_stranded for r in rows} == stranded
    assert {(r.cluster, r.model): r.gpus for r in rows}[("big", "H200-141GB")] == 48


def test_the_overview_figures_equal_the_sums_of_each_gpu(synced, tenancy, staff_user):
    """Per cluster × group, on a synced fleet with pools, drained and unhealthy GPUs: the SQL figures are
    what adding up each GPU (GpuCapacity.compute, its flags, its live allocations) gives."""
    from pools.kinds import counted_slices
    from pools.selectors import overview
    from pools.services import admit_waiting, approve_request, submit_request

    training = GpuGroupFactory(cluster=synced, name="training")
    set_node_group(node=NodeCapacity.objects.get(name="h200-2"), group=training)
    request = submit_request(
        project=tenancy.vision,
        user=tenancy.acme_member,
        items=[("h200-141gb.mig-1g.18gb", 9), ("h100-80gb.full", 2), ("h200-141gb.mig-3g.71gb", 3)],
    )
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    live = Allocation.objects.filter(released_at__isnull=True)
    assert live.count() == 14
    SimulatedDriver(synced).set_gpu_health("h100-1", 7, "failed")
    sync_inventory(cluster=synced)
    GpuCapacity.objects.filter(pk=live.first().gpu_id).update(drained=True)  # drained, still in use
    GpuCapacity.objects.filter(node__name="h200-1", index=7).update(drained=True)
    NodeCapacity.objects.filter(name="h100-1").update(drained=True)

    expected: dict = {}
    held = {a.gpu_id for a in live}
    for a in live.select_related("gpu__node"):
        row = expected.setdefault((a.gpu.node.cluster_id, a.gpu.node.group_id), {})
        row["allocated"] = row.get("allocated", 0) + counted_slices(a.gpu.model, a.profile)
    for gpu in GpuCapacity.objects.filter(present=True, node__present=True).select_related("node"):
        row = expected.setdefault((gpu.node.cluster_id, gpu.node.group_id), {})
        drained = gpu.drained or gpu.node.drained
        for name, add in [
            ("gpus", 1),
            ("total", 7),
            ("stranded", gpu.compute[1]),
            ("drained", drained),
            ("unhealthy", gpu.health != "ok"),
            ("drained_in_use", drained and gpu.pk in held),
        ]:
            row[name] = row.get(name, 0) + int(add)
    found = {
        (c.cluster.pk, g.group.pk if g.group else None): {
            "gpus": g.figures.gpus,
            "total": g.figures.compute_total,
            "stranded": g.figures.compute_stranded,
            "allocated": g.figures.compute_allocated,
            "drained": g.figures.drained_gpus,
            "unhealthy": g.figures.unhealthy_gpus,
            "drained_in_use": g.figures.drained_in_use_gpus,
        }
        for c in overview()
        for g in c.groups
    }
    assert found == expected
    assert found[(synced.pk, training.pk)]["allocated"] > 0 and found[(synced.pk, None)]["allocated"] > 0
    assert {k: v["drained_in_use"] for k, v in found.items()} != {k: 0 for k in found}
    # the summary's figures come from the same function: the groups add up to it
    summary = capacity_summary()
    assert sum(r.compute_allocated for r in summary) == sum(v["allocated"] for v in found.values())
    assert sum(r.compute_stranded for r in summary) == sum(v["stranded"] for v in found.values())


def _grow(name, nodes):
    cluster = ClusterFactory(
        name=name,
        fleet=[
            ("m", nodes // 2, "H200-141GB", [{"3g.71gb": 2}, {"1g.18gb": 7}] + [None] * 6),
            ("f", nodes - nodes // 2, "H100-80GB", FULL),
        ],
    )
    sync_inventory(cluster=cluster)
    return cluster


def test_the_drill_down_pages_run_a_constant_number_of_queries(db, tenancy, client):
    """The overview, a group page and a node page, on a small cluster and on a 60-node one with pools of
    several projects on it: the same number of queries."""
    from pools.services import admit_waiting, approve_request, submit_request

    client.force_login(UserFactory(is_staff=True, is_superuser=True))

    def queries(cluster):
        node = NodeCapacity.objects.filter(cluster=cluster).order_by("name").first()
        return [_queries(client, url) for url in ("/capacity/", group_url(cluster), node_url(node))]

    few = queries(_grow("small", 2))
    big = _grow("big", 60)
    approver = UserFactory(is_staff=True, is_superuser=True)
    for project in (tenancy.vision, tenancy.recsys):
        user = tenancy.acme_member if project == tenancy.vision else tenancy.globex_member
        request = submit_request(project=project, user=user, items=[("h200-141gb.mig-1g.18gb", 5)])
        approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    assert Allocation.objects.count() == 10
    assert queries(big) == few
