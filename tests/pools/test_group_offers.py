"""What a GPU group offers (whole GPUs, MIG instances, time-sliced or MPS shares): whole and MIG unless an
operator says otherwise, set in the admin and refused there with why when it is no offer, shown on the
group's capacity page."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from pools.models import GpuGroup
from tests.factories import ClusterFactory, GpuGroupFactory


def group_form(cluster, **fields) -> dict:
    return {"cluster": cluster.pk, "name": "inference", "description": "", "offers": "whole, mig", **fields}


def test_a_group_offers_whole_gpus_and_mig_instances_unless_told_otherwise(db):
    group = GpuGroupFactory()
    group.full_clean()
    assert GpuGroup.objects.get(pk=group.pk).offers == ["whole", "mig"]


@pytest.mark.parametrize(
    ("typed", "offers"),
    [
        ("whole, mig, ts-4", ["whole", "mig", "ts-4"]),
        ("mps-2 ts-8", ["mps-2", "ts-8"]),
        ('["whole", "ts-2"]', ["whole", "ts-2"]),
    ],
    ids=["commas", "spaces", "json"],
)
def test_operators_set_what_a_group_offers_in_the_admin(typed, offers, db, staff_user, client):
    cluster = ClusterFactory(name="east")
    client.force_login(staff_user("operator"))
    response = client.post(reverse("admin:pools_gpugroup_add"), group_form(cluster, offers=typed))
    assert response.status_code == 302
    group = GpuGroup.objects.get(name="inference")
    assert group.offers == offers
    page = client.get(reverse("admin:pools_gpugroup_change", args=[group.pk])).content.decode()
    assert f'value="{", ".join(offers)}"' in page


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        ("whole, ts-9", "'ts-9': a GPU is shared 2 to 8 ways"),
        ("x", "'x' is no offer"),
        ("", "offers at least one kind"),
        ("ts-4, ts-4", "listed once"),
        ("[whole", "Name the offers apart"),
    ],
    ids=["nine-shares", "unknown", "empty", "twice", "broken-json"],
)
def test_the_admin_refuses_what_is_no_offer_beside_the_field(typed, words, db, staff_user, client):
    cluster = ClusterFactory(name="east")
    group = GpuGroupFactory(cluster=cluster, name="inference")
    client.force_login(staff_user("operator"))
    response = client.post(
        reverse("admin:pools_gpugroup_change", args=[group.pk]), group_form(cluster, offers=typed)
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert words in " ".join(errors["offers"])
    assert "e.g. whole, mig, ts-4" in " ".join(errors["offers"])
    assert GpuGroup.objects.get(pk=group.pk).offers == ["whole", "mig"]


@pytest.mark.parametrize("offers", [["ts-9"], ["x"], [], "whole", [4]])
def test_the_model_refuses_what_is_no_offer(offers, db):
    group = GpuGroupFactory.build(cluster=ClusterFactory(), name="inference", offers=offers)
    with pytest.raises(ValidationError) as refused:
        group.full_clean()
    assert "offers" in refused.value.message_dict


def test_the_group_page_shows_what_the_group_offers(db, staff_user, client):
    cluster = ClusterFactory(name="east")
    group = GpuGroupFactory(cluster=cluster, name="inference", offers=["whole", "ts-4", "mps-2"])
    plain = GpuGroupFactory(cluster=cluster, name="training")
    client.force_login(staff_user("operator"))

    page = client.get(
        reverse("capacity-group", kwargs={"pk": cluster.pk, "group": group.pk})
    ).content.decode()
    assert '<span class="badge">whole GPU</span>' in page
    assert '<span class="badge">time-sliced share (ts-4: 4 per GPU)</span>' in page
    assert '<span class="badge">MPS share (mps-2: 2 per GPU)</span>' in page
    assert "MIG instance" not in page

    page = client.get(
        reverse("capacity-group", kwargs={"pk": cluster.pk, "group": plain.pk})
    ).content.decode()
    assert (
        '<span class="badge">whole GPU</span>' in page and '<span class="badge">MIG instance</span>' in page
    )
    assert "per GPU" not in page
