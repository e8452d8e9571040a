"""Monitoring's part of the operators' capacity pages: the alerts firing within what the page shows, with an
Acknowledge button that goes through the alert service and back; compute slices allocated against used
(the fleet page's selector, kept to the scope); each drawn GPU's newest figures on a node page; and nothing
for people without monitoring's permissions."""

import pytest
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

from monitoring.models import Alert, Latest
from monitoring.pages import capacity as capacity_views
from monitoring.selectors import cluster_usage
from pools.models import GpuCapacity, NodeCapacity
from pools.services import admit_waiting, approve_request, set_node_group, submit_request
from pools.services.inventory import sync_inventory
from portal.shell import CapacityScope
from tests.factories import AlertFactory, ClusterFactory, GpuGroupFactory, UserFactory

FULL = [None] * 8


@pytest.fixture(autouse=True)
def _instant_mig(settings):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0


@pytest.fixture
def fleet(db):
    """Cluster "sim": h200-1 in the training group, h200-2 in none; cluster "far": one node."""
    sim = ClusterFactory(
        name="sim", fleet=[("h200", 2, "H200-141GB", [{"1g.18gb": 7}, {"3g.71gb": 2}, *[None] * 6])]
    )
    far = ClusterFactory(name="far", fleet=[("far", 1, "H100-80GB", FULL)])
    sync_inventory(cluster=sim)
    sync_inventory(cluster=far)
    training = GpuGroupFactory(cluster=sim, name="training")
    set_node_group(node=NodeCapacity.objects.get(name="h200-1"), group=training)
    return {
        "sim": sim,
        "far": far,
        "training": training,
        "grouped": NodeCapacity.objects.get(name="h200-1"),
        "ungrouped": NodeCapacity.objects.get(name="h200-2"),
        "far_node": NodeCapacity.objects.get(name="far-1"),
    }


def gpu_of(node, index=0):
    return GpuCapacity.objects.get(node=node, index=index)


def node_page(node):
    return reverse("capacity-node", kwargs={"pk": node.pk})


def group_page(cluster, group=None):
    return reverse("capacity-group", kwargs={"pk": cluster.pk, "group": group.pk if group else "none"})


def alert_on(node, message):
    return AlertFactory(gpu=gpu_of(node), message=message)


def test_each_page_shows_the_alerts_firing_within_it(fleet, operator, client):
    alert_on(fleet["grouped"], "training GPU hot")
    alert_on(fleet["ungrouped"], "no-group GPU hot")
    alert_on(fleet["far_node"], "far is hot")
    AlertFactory(gpu=gpu_of(fleet["grouped"], 1), message="long over", resolved_at=timezone.now())
    AlertFactory(
        gpu=None, node=fleet["ungrouped"], subject=f"node:{fleet['ungrouped'].pk}", message="node silent"
    )
    client.force_login(operator)

    def shown(url):
        body = client.get(url).content.decode()
        return {
            m
            for m in ("training GPU hot", "no-group GPU hot", "far is hot", "long over", "node silent")
            if m in body
        }

    assert shown("/capacity/") == {"training GPU hot", "no-group GPU hot", "far is hot", "node silent"}
    assert shown(group_page(fleet["sim"], fleet["training"])) == {"training GPU hot"}
    assert shown(group_page(fleet["sim"])) == {"no-group GPU hot", "node silent"}
    assert shown(node_page(fleet["ungrouped"])) == {"no-group GPU hot", "node silent"}
    assert shown(node_page(fleet["far_node"])) == {"far is hot"}


def test_an_alert_acknowledged_from_a_capacity_page_goes_through_the_service_and_back(
    fleet, operator, client
):
    alert = alert_on(fleet["grouped"], "training GPU hot")
    client.force_login(operator)
    page = node_page(fleet["grouped"])
    body = client.get(page).content.decode()
    action = reverse("monitoring-alert-acknowledge", kwargs={"pk": alert.pk})
    assert f'action="{action}"' in body and f'name="next" value="{page}"' in body
    response = client.post(action, {"next": page})
    assert response.status_code == 302 and response.url == page
    alert.refresh_from_db()
    assert alert.acknowledged_by == operator and alert.acknowledged_at is not None
    body = client.get(page).content.decode()
    assert "training GPU hot" in body and f'action="{action}"' not in body  # acknowledged: no button
    # the service's refusal holds here too: a resolved alert answers 409 and changes nothing
    Alert.objects.filter(pk=alert.pk).update(resolved_at=timezone.now(), acknowledged_at=None)
    assert client.post(action, {"next": page}).status_code == 409
    assert Alert.objects.get(pk=alert.pk).acknowledged_at is None
    # a next of another site goes to the alert's own page
    other = alert_on(fleet["far_node"], "far is hot")
    url = reverse("monitoring-alert-acknowledge", kwargs={"pk": other.pk})
    response = client.post(url, {"next": "https://evil.example/"})
    assert response.url == reverse("monitoring-alert", kwargs={"pk": other.pk})


def test_the_node_page_shows_each_gpus_newest_figures(fleet, operator, client):
    now = timezone.now()
    node = fleet["grouped"]
    Latest.objects.create(
        gpu=gpu_of(node, 2), slot=-1, at=now, source="simulated", temperature_c=71.0, power_w=433.0,
        sm_active_pct=58.0, memory_used_bytes=40 * 2**30, memory_total_bytes=141 * 2**30,
        ecc_corrected=12, ecc_uncorrected=3,
    )  # fmt: skip
    Latest.objects.create(
        gpu=gpu_of(fleet["ungrouped"], 2), slot=-1, at=now, source="simulated", power_w=999.0
    )
    client.force_login(operator)
    body = client.get(node_page(node)).content.decode()
    assert body.count(reverse("monitoring-gpu", kwargs={"pk": gpu_of(node, 0).pk})) == 1
    assert all(reverse("monitoring-gpu", kwargs={"pk": gpu_of(node, i).pk}) in body for i in range(8))
    for figure in ("71 °C", "433", "58 %", '<span class="badge bad">3</span>', ">12<"):
        assert figure in body
    assert ">999<" not in body  # another node's GPU (as a cell: the bare digits may be in a UUID)
    assert body.count("No figures received yet.") == 7


def test_allocated_against_used_is_the_fleet_pages_figure_kept_to_the_scope(fleet, operator, tenancy):
    approver = UserFactory(is_staff=True, is_superuser=True)
    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-1g.18gb", 9)]
    )
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    from monitoring.selectors.capacity import scope_usage

    whole = {row.name: row for row in cluster_usage()}
    assert scope_usage(scope=CapacityScope()).totals.allocated == sum(r.allocated for r in whole.values())
    sim = fleet["sim"]
    in_cluster = scope_usage(scope=CapacityScope(cluster_id=sim.pk))
    assert [r.name for r in in_cluster.clusters] == ["sim"] and in_cluster.totals.allocated == 9
    grouped = scope_usage(scope=CapacityScope(cluster_id=sim.pk, group_id=fleet["training"].pk))
    ungrouped = scope_usage(scope=CapacityScope(cluster_id=sim.pk, ungrouped=True))
    assert grouped.totals.allocated + ungrouped.totals.allocated == 9
    assert grouped.totals.gpus == ungrouped.totals.gpus == 8
    node = fleet["grouped"]
    on_node = scope_usage(scope=CapacityScope(cluster_id=sim.pk, node_id=node.pk))
    held = sum(1 for a in request.pool.allocations.all() if a.gpu.node_id == node.pk)  # 1g: one slice each
    assert on_node.totals.allocated == held == grouped.totals.allocated


def _request(user, path="/capacity/"):
    request = RequestFactory().get(path)
    request.user = user
    return request


def test_nothing_for_staff_without_monitorings_permissions(fleet, staff_user, operator):
    alert_on(fleet["grouped"], "training GPU hot")
    scope = CapacityScope(
        cluster_id=fleet["sim"].pk, node_id=fleet["grouped"].pk, gpu_ids=(gpu_of(fleet["grouped"]).pk,)
    )
    assert capacity_views.section(_request(staff_user("finance")), scope) == ""
    assert capacity_views.section(_request(UserFactory()), scope) == ""
    assert "training GPU hot" in capacity_views.section(_request(operator), scope)


def test_approvers_see_the_figures_but_not_the_alerts(fleet, staff_user, client):
    alert_on(fleet["grouped"], "training GPU hot")
    approver = staff_user("approver")
    client.force_login(approver)
    body = client.get(node_page(fleet["grouped"])).content.decode()
    assert (
        "Newest figures of each GPU" in body and "training GPU hot" not in body and "Acknowledge" not in body
    )


def test_the_alerts_are_paged_under_their_own_parameter(fleet, operator, client):
    for i in range(12):
        AlertFactory(gpu=gpu_of(fleet["grouped"], i % 8), subject=f"n{i}", message=f"alert number {i:02d}")
    client.force_login(operator)
    page = node_page(fleet["grouped"])
    first = client.get(page).content.decode()
    second = client.get(page + "?alerts_page=2").content.decode()
    found = [[i for i in range(12) if f"alert number {i:02d}" in body] for body in (first, second)]
    assert len(found[0]) == 10 and len(found[1]) == 2 and not set(found[0]) & set(found[1])
    assert client.get(page + "?alerts_page=x").status_code == 200
