"""A tenant asks again: a rejected or cancelled request copied into the form, spec names people read,
"+me" explained, and the pool page's manifest with one container per MIG device."""

import html
import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.urls import reverse

from pools.manifest import Unit, pods
from pools.models import Pool, PoolRequest
from pools.services import (
    admit_waiting,
    approve_request,
    cancel_request,
    provision_step,
    reject_request,
    submit_request,
)
from pools.specs import Spec
from tests.factories import GpuGroupFactory


def new_request_url(query: str = "", tenant: str = "acme", project: str = "vision") -> str:
    return reverse("pool-request-new", kwargs={"tenant_slug": tenant, "slug": project}) + query


@pytest.fixture
def rejected(fleet, tenancy, staff_user):
    fleet.nodes.update(group=GpuGroupFactory(cluster=fleet, name="training"))
    asked = submit_request(
        project=tenancy.vision,
        user=tenancy.acme_member,
        items=[("h200-141gb.mig-3g.71gb", 2), ("h100-80gb.full", 1)],
        cluster=fleet,
        purpose="training",
        justification="fine-tune the vision model",
    )
    return reject_request(request_id=asked.pk, approver=staff_user("approver"), reason="too big")


def selected(page: str, name: str) -> str | None:
    select = re.search(rf'<select name="{name}".*?</select>', page, re.S).group(0)
    found = re.search(r'<option value="([^"]*)"[^>]*selected', select)
    return found.group(1) if found else None


def test_a_rejected_request_offers_to_ask_again_with_the_same_values(rejected, tenancy, client):
    client.force_login(tenancy.acme_member)
    page = client.get(reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": rejected.pk})).content
    assert f'href="{new_request_url(f"?copy={rejected.pk}")}"' in page.decode()

    response = client.get(new_request_url(f"?copy={rejected.pk}"))
    form = response.content.decode()
    assert response.status_code == 200
    assert selected(form, "spec_0") == "h200-141gb.mig-3g.71gb"
    assert selected(form, "spec_1") == "h100-80gb.full"
    assert selected(form, "spec_2") in (None, "")
    assert 'name="count_0" value="2"' in form and 'name="count_1" value="1"' in form
    assert selected(form, "cluster") == "sim" and selected(form, "purpose") == "training"
    assert "fine-tune the vision model</textarea>" in form
    assert PoolRequest.objects.count() == 1  # nothing is asked until the form is sent


def test_a_cancelled_request_offers_it_and_a_live_one_does_not(fleet, tenancy, client):
    client.force_login(tenancy.acme_member)
    asked = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    url = reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": asked.pk})
    assert "?copy=" not in client.get(url).content.decode()
    cancel_request(request_id=asked.pk, user=tenancy.acme_member)
    assert f"?copy={asked.pk}" in client.get(url).content.decode()


def test_a_viewer_is_not_offered_to_ask_again(rejected, tenancy, client):
    client.force_login(tenancy.acme_viewer)
    page = client.get(reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": rejected.pk}))
    assert page.status_code == 200 and "?copy=" not in page.content.decode()


@pytest.mark.parametrize("copy", ["abc", "-1", "1.5", "²", "999999", "99999999999999999999999"])
def test_a_bad_copy_id_is_not_found(copy, rejected, tenancy, client):
    client.force_login(tenancy.acme_member)
    assert client.get(new_request_url(), {"copy": copy}).status_code == 404


def test_another_tenants_request_cannot_be_copied(rejected, tenancy, client):
    client.force_login(tenancy.globex_member)
    assert client.get(new_request_url(f"?copy={rejected.pk}", "globex", "recsys")).status_code == 404
    page = client.get(new_request_url("", "globex", "recsys")).content.decode()
    assert "fine-tune the vision model" not in page


def test_the_form_names_specs_as_people_read_them_and_explains_plus_me(fleet, tenancy, client):
    client.force_login(tenancy.acme_member)
    form = client.get(new_request_url()).content.decode()
    assert '<option value="h200-141gb.mig-3g.71gb">H200-141GB 3g.71gb</option>' in form
    assert '<option value="h100-80gb.full">H100-80GB full</option>' in form
    assert ">h200-141gb.mig-3g.71gb<" not in form
    assert 'aria-describedby="media-hint"' in form
    hint = re.search(r'<p class="helptext" id="media-hint">(.*?)</p>', form, re.S).group(1)
    assert "+me" in html.unescape(hint) and "media extension" in hint


def test_a_mixed_pool_has_one_container_per_mig_device(fleet, tenancy, staff_user, client):
    request = submit_request(
        project=tenancy.vision,
        user=tenancy.acme_member,
        items=[("h200-141gb.mig-1g.18gb", 2), ("h200-141gb.mig-3g.71gb", 1), ("h100-80gb.full", 2)],
    )
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    pool = Pool.objects.get()
    while provision_step(pool_id=pool.pk) != "done":
        pass
    client.force_login(tenancy.acme_member)
    page = client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})).content.decode()
    found = re.search(r'<pre class="manifest" id="manifest">(.*?)</pre>', page, re.S).group(1)
    manifests = list(yaml.safe_load_all(html.unescape(found)))
    # H200 instances and H100 GPUs lie on different nodes: a pod for each, pinned to its node.
    nodes = {a.gpu.node.name for a in pool.allocations.select_related("gpu__node")}
    assert len(manifests) == len(nodes) == 2
    assert {m["spec"]["nodeSelector"]["kubernetes.io/hostname"] for m in manifests} == nodes
    assert len({m["metadata"]["name"] for m in manifests}) == 2
    assert {m["metadata"]["namespace"] for m in manifests} == {tenancy.vision.namespace}
    limits = [c["resources"]["limits"] for m in manifests for c in m["spec"]["containers"]]
    assert all(len(one) == 1 for one in limits)
    mig = sorted(name for one in limits for name, count in one.items() if name.startswith("nvidia.com/mig-"))
    assert mig == ["nvidia.com/mig-1g.18gb", "nvidia.com/mig-1g.18gb", "nvidia.com/mig-3g.71gb"]
    assert all(count == 1 for one in limits for name, count in one.items() if name != "nvidia.com/gpu")
    assert {"nvidia.com/gpu": 2} in limits
    for manifest in manifests:
        names = [c["name"] for c in manifest["spec"]["containers"]]
        assert len(set(names)) == len(names)
    assert 'data-copy="manifest"' in page and "portal/copy." in page


def containers(*resources, claims=()):
    units = [Unit("n1", resource) for resource in resources]
    units += [Unit("n1", resource, claim) for resource, claim in claims]
    found = pods(units)
    return found[0].containers if found else []


def test_pod_containers_give_each_mig_device_its_own():
    found = containers(*["nvidia.com/mig-1g.18gb"] * 3, *["nvidia.com/gpu"] * 4)
    assert [(c.resource, c.count) for c in found] == [
        ("nvidia.com/gpu", 4),
        *[("nvidia.com/mig-1g.18gb", 1)] * 3,
    ]
    assert containers() == []


def test_each_share_gets_a_container_asking_for_one_share():
    found = containers("nvidia.com/gpu.shared", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.18gb")
    assert [(c.name, c.resource, c.count) for c in found] == [
        ("share-0", "nvidia.com/gpu.shared", 1),
        ("share-1", "nvidia.com/gpu.shared", 1),
        ("mig-2", "nvidia.com/mig-1g.18gb", 1),
    ]


def test_under_dra_each_container_names_the_claims_of_its_units_and_the_pod_lists_them():
    (pod,) = pods(
        [
            Unit("n1", "nvidia.com/gpu", "gpu-portal-7-12"),
            Unit("n1", "nvidia.com/gpu", "gpu-portal-7-11"),
            Unit("n1", "nvidia.com/mig-1g.18gb", "gpu-portal-7-13"),
            Unit("n1", "nvidia.com/gpu.shared"),
        ]
    )
    assert pod.claims == (
        ("gpu-0", "gpu-portal-7-11"),
        ("gpu-1", "gpu-portal-7-12"),
        ("gpu-2", "gpu-portal-7-13"),
    )
    assert [(c.name, c.claims) for c in pod.containers] == [
        ("gpus", ("gpu-0", "gpu-1")),
        ("share-0", ()),
        ("mig-1", ("gpu-2",)),
    ]


def test_a_pool_on_one_node_is_one_pod_and_on_two_nodes_one_pod_each():
    (one,) = pods([Unit("n1", "nvidia.com/gpu"), Unit("n1", "nvidia.com/mig-1g.18gb")])
    assert (one.name, one.node, len(one.containers)) == ("gpu-job", "n1", 2)
    two = pods([Unit("n2", "nvidia.com/gpu"), Unit("n1", "nvidia.com/gpu"), Unit("n2", "nvidia.com/gpu")])
    assert [(p.name, p.node, [(c.resource, c.count) for c in p.containers]) for p in two] == [
        ("gpu-job-1", "n1", [("nvidia.com/gpu", 1)]),
        ("gpu-job-2", "n2", [("nvidia.com/gpu", 2)]),
    ]


def test_the_request_form_fits_a_narrow_screen():
    css = (Path(settings.BASE_DIR) / "static/portal/portal.css").read_text()
    # The last word on .columns.even must be the narrow screen's single column, after its two columns.
    narrow = [
        m.start() for m in re.finditer(r"@media \(max-width: 720px\) \{[^@]*\.columns\.even \{ grid", css)
    ]
    wide = css.index(".columns.even { grid-template-columns: 1fr 1fr; }")
    assert narrow and narrow[-1] > wide
    assert re.search(r"#request-form select[^{]*\{[^}]*max-width: 100%", css)


SIX_SPECS = [
    "h200-141gb.mig-1g.18gb",
    "h200-141gb.mig-1g.35gb",
    "h200-141gb.mig-2g.35gb",
    "h200-141gb.mig-3g.71gb",
    "h100-80gb.mig-1g.10gb",
    "h100-80gb.full",
]


def test_a_request_of_more_lines_than_the_form_shows_is_copied_whole(fleet, tenancy, client):
    asked = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[(spec, 1) for spec in SIX_SPECS]
    )
    cancel_request(request_id=asked.pk, user=tenancy.acme_member)
    client.force_login(tenancy.acme_member)
    form = client.get(new_request_url(f"?copy={asked.pk}")).content.decode()
    assert [selected(form, f"spec_{n}") for n in range(6)] == SIX_SPECS
    assert 'name="spec_6"' not in form


def test_add_a_line_shows_the_form_again_one_line_longer_and_sends_nothing(fleet, tenancy, client):
    client.force_login(tenancy.acme_member)
    filled = {f"spec_{n}": spec for n, spec in enumerate(SIX_SPECS[:4])}
    filled |= {"count_0": "3", "justification": "more", "add_row": "1"}
    response = client.post(new_request_url(), filled)
    form = response.content.decode()
    assert response.status_code == 200 and PoolRequest.objects.count() == 0
    assert [selected(form, f"spec_{n}") for n in range(4)] == SIX_SPECS[:4]
    assert selected(form, "spec_4") in (None, "")  # the new, empty line
    assert 'name="count_0" value="3"' in form and "more</textarea>" in form
    assert 'name="spec_5"' not in form

    del filled["add_row"]
    filled["spec_4"] = SIX_SPECS[4]
    response = client.post(new_request_url(), filled)
    assert response.status_code == 302
    created = PoolRequest.objects.get()
    asked = sorted(Spec(item.gpu_model, item.profile).id for item in created.items.all())
    assert asked == sorted(SIX_SPECS[:5])
