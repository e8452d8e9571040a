"""Tenant pages of pools: ask for GPUs, follow the request, use and release the pool."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pools.models import Pool, PoolRequest
from pools.services import admit_waiting, approve_request, provision_step


def new_request_url():
    return reverse("pool-request-new", kwargs={"tenant_slug": "acme", "slug": "vision"})


def test_a_member_asks_follows_uses_and_releases(fleet, tenancy, staff_user, client):
    client.force_login(tenancy.acme_member)
    form = client.get(new_request_url()).content.decode()
    assert "h200-141gb.mig-1g.18gb" in form and "Available now" in form
    response = client.post(
        new_request_url(),
        {
            "spec_0": "h200-141gb.mig-2g.35gb",
            "count_0": "2",
            "spec_1": "h100-80gb.full",
            "count_1": "1",
            "justification": "tests",
        },
    )
    request = PoolRequest.objects.get()
    assert response.status_code == 302 and response.url == reverse(
        "pool-request", kwargs={"tenant_slug": "acme", "pk": request.pk}
    )
    page = client.get(response.url).content.decode()
    assert "2 × H200-141GB 2g.35gb" in page and "Cancel the request" in page

    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    pool = Pool.objects.get()
    while provision_step(pool_id=pool.pk) != "done":
        pass
    page = client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})).content.decode()
    assert (
        "namespace: acme-vision" in page
        and page.count("nvidia.com/mig-2g.35gb: 1") == 2  # one container per MIG device
        and "nvidia.com/gpu: 1" in page
    )
    project_page = client.get(
        reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})
    ).content.decode()
    assert f"#{pool.pk}" in project_page

    client.post(reverse("pool-release", kwargs={"tenant_slug": "acme", "pk": pool.pk}))
    assert Pool.objects.get().state == "releasing"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "at least one item"),
        ({"spec_0": "h100-80gb.full", "count_0": "0"}, "greater than or equal to 1"),
        ({"spec_0": "h100-80gb.full", "count_0": "99"}, "could ever hold"),
        ({"spec_0": "not-a-spec", "count_0": "1"}, "not one of the available choices"),
    ],
)
def test_bad_forms_are_refused_and_nothing_is_written(data, message, fleet, tenancy, client):
    client.force_login(tenancy.acme_member)
    response = client.post(new_request_url(), data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not PoolRequest.objects.exists()


def test_the_project_page_runs_a_constant_number_of_queries(fleet, tenancy, staff_user, client):
    from pools.services import submit_request

    client.force_login(tenancy.acme_member)
    url = reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        return len(ctx)

    approver = staff_user("approver")
    first = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=first.pk, approver=approver)
    admit_waiting()
    few = queries()
    for _ in range(4):
        request = submit_request(
            project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)]
        )
        approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    assert Pool.objects.count() == 5
    assert queries() == few
