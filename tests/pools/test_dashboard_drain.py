"""Draining from the capacity pages and the admin: the warning that names the pools left running, the way
back to the page the operator came from, the permission, and the pages' project colours, legend and
drained-in-use marker."""

import re

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from pools import capacity_version
from pools.models import GpuCapacity, NodeCapacity
from pools.services.inventory import sync_inventory
from tests.factories import AllocationFactory, PoolFactory, ProjectFactory, UserFactory

LEGEND_ENTRY = re.compile(
    r'<li class="legend-project"><span class="swatch holder-(\d+)"></span> ([^<]+)</li>'
)


@pytest.fixture
def synced(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    return sim_cluster


@pytest.fixture
def held(synced, tenancy):
    """GPU 0 of h100-1 held whole by an acme/vision pool, GPU 1 free; a 1g instance of h200-1's GPU 0
    held by a globex/recsys pool."""
    full = GpuCapacity.objects.get(node__name="h100-1", index=0)
    vision = PoolFactory(project=tenancy.vision, cluster=synced)
    AllocationFactory(pool=vision, gpu=full)
    mig = GpuCapacity.objects.get(node__name="h200-1", index=0)
    recsys = PoolFactory(project=tenancy.recsys, cluster=synced)
    AllocationFactory(pool=recsys, gpu=mig, profile="1g.18gb")
    return {"gpu": full, "vision": vision, "recsys": recsys, "mig": mig}


def gpu_url(gpu):
    return reverse("capacity-gpu-drain", kwargs={"pk": gpu.pk})


def node_url(node):
    return reverse("capacity-node-drain", kwargs={"pk": node.pk})


def group_page(cluster):
    return reverse("capacity-group", kwargs={"pk": cluster.pk, "group": "none"})


def node_page(node):
    return reverse("capacity-node", kwargs={"pk": node.pk})


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_draining_a_gpu_first_names_the_pools_on_it_and_changes_nothing(held, staff_user, client):
    client.force_login(staff_user("operator"))
    response = client.post(gpu_url(held["gpu"]), {"action": "drain"})
    assert response.status_code == 200
    body = response.content.decode()
    assert f"acme / vision / pool #{held['vision'].pk}" in body
    assert "recsys" not in body
    assert not GpuCapacity.objects.get(pk=held["gpu"].pk).drained


def test_draining_a_free_gpu_says_no_pool_holds_it(held, staff_user, client):
    client.force_login(staff_user("operator"))
    free = GpuCapacity.objects.get(node__name="h100-1", index=1)
    body = client.post(gpu_url(free), {"action": "drain"}).content.decode()
    assert "No pool holds anything there." in body and "pool #" not in body


def test_confirming_drains_the_gpu_through_the_service_and_warns(held, staff_user, client):
    client.force_login(staff_user("operator"))
    before = capacity_version.current()
    response = client.post(gpu_url(held["gpu"]), {"action": "drain", "confirmed": "yes"})
    assert response.status_code == 302 and response.url == reverse("capacity-dashboard")
    assert GpuCapacity.objects.get(pk=held["gpu"].pk).drained
    assert capacity_version.current() != before  # the service, not a bare update, changed it
    assert f"These pools keep running on what was drained: acme / vision / pool #{held['vision'].pk}." in (
        texts(response)
    )


def test_confirming_drains_the_node_and_names_every_pool_on_its_gpus(held, staff_user, client):
    client.force_login(staff_user("operator"))
    node = NodeCapacity.objects.get(name="h200-1")
    confirm = client.post(node_url(node), {"action": "drain"}).content.decode()
    assert f"globex / recsys / pool #{held['recsys'].pk}" in confirm and "vision" not in confirm
    assert not NodeCapacity.objects.get(pk=node.pk).drained
    response = client.post(node_url(node), {"action": "drain", "confirmed": "yes"})
    assert response.status_code == 302
    assert NodeCapacity.objects.get(pk=node.pk).drained
    assert any(f"globex / recsys / pool #{held['recsys'].pk}" in text for text in texts(response))


def test_undrain_needs_no_confirmation(held, staff_user, client):
    client.force_login(staff_user("operator"))
    GpuCapacity.objects.filter(pk=held["gpu"].pk).update(drained=True)
    NodeCapacity.objects.filter(name="h200-1").update(drained=True)
    node = NodeCapacity.objects.get(name="h200-1")
    assert client.post(gpu_url(held["gpu"]), {"action": "undrain"}).status_code == 302
    assert client.post(node_url(node), {"action": "undrain"}).status_code == 302
    assert not GpuCapacity.objects.get(pk=held["gpu"].pk).drained
    assert not NodeCapacity.objects.get(pk=node.pk).drained


def test_get_changes_nothing(held, staff_user, client):
    client.force_login(staff_user("operator"))
    node = NodeCapacity.objects.get(name="h100-1")
    for url in (gpu_url(held["gpu"]), node_url(node)):
        assert client.get(url, {"action": "drain", "confirmed": "yes"}).status_code == 405
    assert not GpuCapacity.objects.get(pk=held["gpu"].pk).drained
    assert not NodeCapacity.objects.get(pk=node.pk).drained


def test_unknown_ids_are_not_found(held, staff_user, client):
    client.force_login(staff_user("operator"))
    missing = {"action": "drain", "confirmed": "yes"}
    assert client.post(reverse("capacity-gpu-drain", kwargs={"pk": 999999}), missing).status_code == 404
    assert client.post(reverse("capacity-node-drain", kwargs={"pk": 999999}), missing).status_code == 404


@pytest.mark.parametrize("who", ["approver", "finance", "tenant"])
def test_without_the_permission_no_button_and_a_404(who, held, staff_user, tenancy, client):
    user = tenancy.acme_admin if who == "tenant" else staff_user(who)
    client.force_login(user)
    node = NodeCapacity.objects.get(name="h100-1")
    if who == "approver":  # sees the capacity pages, may not drain
        for page in (group_page(held["gpu"].node.cluster), node_page(node)):
            body = client.get(page).content.decode()
            assert 'class="gpu ' in body
            assert "drain-button" not in body and 'id="drain-form"' not in body
    confirmed = {"action": "drain", "confirmed": "yes"}
    assert client.post(gpu_url(held["gpu"]), confirmed).status_code == 404
    assert client.post(node_url(node), confirmed).status_code == 404
    assert not GpuCapacity.objects.get(pk=held["gpu"].pk).drained
    assert not NodeCapacity.objects.get(pk=node.pk).drained


def test_operators_get_drain_and_undrain_buttons(held, staff_user, client):
    GpuCapacity.objects.filter(pk=held["gpu"].pk).update(drained=True)
    client.force_login(staff_user("operator"))
    body = client.get(node_page(held["gpu"].node)).content.decode()
    assert f'formaction="{gpu_url(held["gpu"])}" name="action" value="undrain"' in body
    free = GpuCapacity.objects.get(node__name="h100-1", index=1)
    assert f'formaction="{gpu_url(free)}" name="action" value="drain"' in body
    assert f'formaction="{node_url(free.node)}" name="action" value="drain"' in body


@pytest.mark.parametrize(
    ("model", "node_or_gpu"), [("gpucapacity", lambda h: h["gpu"]), ("nodecapacity", lambda h: h["gpu"].node)]
)
def test_the_admin_drain_action_names_the_pools_affected(model, node_or_gpu, held, client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    target = node_or_gpu(held)
    response = client.post(
        reverse(f"admin:pools_{model}_changelist"),
        {"action": "drain", "_selected_action": [target.pk]},
        follow=True,
    )
    shown = texts(response)
    assert "1 drained." in shown
    assert (
        f"These pools keep running on what was drained: acme / vision / pool #{held['vision'].pk}." in shown
    )
    target.refresh_from_db()
    assert target.drained


def test_the_admin_undrain_action_warns_of_nothing(held, client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(
        reverse("admin:pools_gpucapacity_changelist"),
        {"action": "undrain", "_selected_action": [held["gpu"].pk]},
        follow=True,
    )
    assert not any("keep running" in text for text in texts(response))


def test_the_legend_gives_each_project_on_the_page_its_own_colour(synced, tenancy, staff_user, client):
    gpus = list(GpuCapacity.objects.filter(mig_enabled=False).order_by("node__name", "index")[:13])
    assert len(gpus) == 13
    names = []
    for i, gpu in enumerate(gpus):
        project = ProjectFactory(tenant=tenancy.acme, slug=f"p{i:02d}")
        AllocationFactory(pool=PoolFactory(project=project, cluster=synced), gpu=gpu)
        names.append(f"acme/p{i:02d}")
    client.force_login(staff_user("operator"))
    body = client.get(group_page(synced)).content.decode()
    legend = {name: int(colour) for colour, name in LEGEND_ENTRY.findall(body)}
    assert sorted(legend) == names
    assert len({legend[name] for name in names[:12]}) == 12  # twelve projects, twelve colours
    assert legend[names[12]] == legend[names[0]]  # the thirteenth cycles back
    # the instances are drawn in the colour the legend gives their project
    for name, colour in legend.items():
        assert f"seg held holder-{colour} " in body
        assert f"full · {name}" in body


def test_a_drained_gpu_still_in_use_is_marked_and_explained(held, staff_user, client):
    free = GpuCapacity.objects.get(node__name="h100-1", index=1)
    GpuCapacity.objects.filter(pk__in=[held["gpu"].pk, free.pk]).update(drained=True)
    client.force_login(staff_user("operator"))
    body = client.get(group_page(free.node.cluster)).content.decode()
    assert body.count("drained-in-use-mark") == 1  # the held one, not the free one
    assert body.count('class="gpu health-ok drained drained-in-use"') == 1
    assert "Drained, still in use" in body  # the legend's entry


def test_a_drained_node_marks_its_gpus_in_use(held, staff_user, client):
    NodeCapacity.objects.filter(name="h200-1").update(drained=True)
    client.force_login(staff_user("operator"))
    body = client.get(group_page(held["mig"].node.cluster)).content.decode()
    assert body.count("drained-in-use-mark") == 1


def test_a_node_page_lists_only_the_projects_drawn_on_it(held, staff_user, client):
    client.force_login(staff_user("operator"))
    body = client.get(node_page(held["gpu"].node)).content.decode()
    legend = {name: int(colour) for colour, name in LEGEND_ENTRY.findall(body)}
    assert legend == {"acme/vision": 0}  # globex/recsys holds an instance on another node


def test_a_drain_from_a_node_page_warns_of_the_pools_and_returns_there(held, staff_user, client):
    client.force_login(staff_user("operator"))
    page = node_page(held["gpu"].node) + "?alerts_page=1"
    body = client.get(page).content.decode()
    assert 'name="next" value="' + page.replace("&", "&amp;") + '"' in body
    confirm = client.post(gpu_url(held["gpu"]), {"action": "drain", "next": page})
    shown = confirm.content.decode()
    assert f"acme / vision / pool #{held['vision'].pk}" in shown
    assert 'name="next" value="' + page.replace("&", "&amp;") + '"' in shown  # carried to the confirmation
    assert f'href="{page.replace("&", "&amp;")}"' in shown  # cancel goes back there too
    assert not GpuCapacity.objects.get(pk=held["gpu"].pk).drained
    done = client.post(gpu_url(held["gpu"]), {"action": "drain", "confirmed": "yes", "next": page})
    assert done.status_code == 302 and done.url == page
    assert GpuCapacity.objects.get(pk=held["gpu"].pk).drained
    assert any(f"acme / vision / pool #{held['vision'].pk}" in text for text in texts(done))
    back = client.post(node_url(held["gpu"].node), {"action": "undrain", "next": page})
    assert back.status_code == 302 and back.url == page


@pytest.mark.parametrize(
    "unsafe", ["https://evil.example/capacity/", "//evil.example/", "javascript:alert(1)", ""]
)
def test_a_next_of_another_site_goes_back_to_the_overview(unsafe, held, staff_user, client):
    client.force_login(staff_user("operator"))
    response = client.post(gpu_url(held["gpu"]), {"action": "drain", "confirmed": "yes", "next": unsafe})
    assert response.status_code == 302 and response.url == reverse("capacity-dashboard")
    assert GpuCapacity.objects.get(pk=held["gpu"].pk).drained
