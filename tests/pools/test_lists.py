"""Lists that scale: the project page's latest requests and pools, the tenant's paged and filtered lists
of both, and admin changelists of 50 rows with one count."""

from datetime import timedelta

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pools.models import PoolRequest
from tests.factories import PoolFactory, PoolRequestFactory, ProjectFactory, UserFactory

REQUEST_ROW = 'class="badge request-'
POOL_ROW = 'class="badge pool-'


def project_url() -> str:
    return reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})


def list_url(name: str, **query) -> str:
    url = reverse(name, kwargs={"tenant_slug": "acme"})
    return url + ("?" + "&".join(f"{key}={value}" for key, value in query.items()) if query else "")


def queries(client, url: str, status: int = 200) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == status, response.content.decode()[:500]
    return len(ctx), response.content.decode()


# --- the project page ----------------------------------------------------------------------------


def test_the_project_page_shows_the_latest_ten_and_links_to_the_rest(tenancy, client):
    client.force_login(tenancy.acme_member)
    PoolRequestFactory.create_batch(3, project=tenancy.vision, submitted_by=tenancy.acme_member)
    _, page = queries(client, project_url())
    assert page.count(REQUEST_ROW) == 3
    assert "All requests" not in page and "All pools" not in page

    made = PoolRequestFactory.create_batch(12, project=tenancy.vision, submitted_by=tenancy.acme_member)
    PoolFactory.create_batch(11, project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    _, page = queries(client, project_url())
    assert page.count(REQUEST_ROW) == 10 and page.count(POOL_ROW) == 10
    newest = PoolRequest.objects.latest("pk")  # the pools' own requests came last
    assert f"#{newest.pk}<" in page and f"#{made[-1].pk}<" not in page
    assert list_url("tenant-requests", project="vision") in page
    assert list_url("tenant-pools", project="vision") in page


def test_the_project_page_lists_live_pools_before_newer_released_ones(tenancy, client):
    client.force_login(tenancy.acme_member)
    live = PoolFactory(
        project=tenancy.vision,
        request__submitted_by=tenancy.acme_member,
        state="active",
        reserved_at=timezone.now() - timedelta(hours=5),
    )
    PoolFactory.create_batch(
        12, project=tenancy.vision, request__submitted_by=tenancy.acme_member, state="released"
    )
    _, page = queries(client, project_url())
    assert page.count(POOL_ROW) == 10
    assert page.index(f"#{live.pk}<") < page.index('class="badge pool-released"')


def test_the_project_page_stays_small_at_a_thousand_requests(tenancy, client):
    client.force_login(tenancy.acme_member)
    PoolRequestFactory.create_batch(
        11, project=tenancy.vision, submitted_by=tenancy.acme_member, state="queued"
    )
    PoolFactory.create_batch(11, project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    few, _ = queries(client, project_url())
    PoolRequestFactory.create_batch(
        1000, project=tenancy.vision, submitted_by=tenancy.acme_member, state="queued"
    )
    PoolFactory.create_batch(200, project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    many, page = queries(client, project_url())
    assert many == few
    assert page.count(REQUEST_ROW) == 10 and page.count(POOL_ROW) == 10


# --- the tenant's lists ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "row"), [("tenant-requests", REQUEST_ROW), ("tenant-pools", POOL_ROW)])
def test_a_tenant_list_pages_fifty_at_a_time_newest_first(name, row, tenancy, client):
    client.force_login(tenancy.acme_member)
    if name == "tenant-requests":
        newest = PoolRequestFactory.create_batch(
            60, project=tenancy.vision, submitted_by=tenancy.acme_member
        )[-1]
    else:
        newest = PoolFactory.create_batch(
            60, project=tenancy.vision, request__submitted_by=tenancy.acme_member
        )[-1]
    _, first = queries(client, list_url(name))
    assert first.count(row) == 50
    assert first.index(f"#{newest.pk}<") < first.index(row, first.index(row) + 1)  # first row
    assert "Page 1 of 2" in first and "?page=2" in first
    _, second = queries(client, list_url(name, page=2))
    assert second.count(row) == 10 and "Page 2 of 2" in second
    for bad, shown in [("abc", "Page 1 of 2"), ("999", "Page 2 of 2"), ("-1", "Page 2 of 2"), ("", "Page 1")]:
        assert shown in queries(client, list_url(name, page=bad))[1]


def test_filters_choose_the_state_and_the_project_and_paging_keeps_them(tenancy, client):
    client.force_login(tenancy.acme_member)
    other = ProjectFactory(tenant=tenancy.acme, slug="speech", name="Speech")
    queued = PoolRequestFactory.create_batch(
        55, project=tenancy.vision, submitted_by=tenancy.acme_member, state="queued"
    )
    PoolRequestFactory.create_batch(
        2, project=tenancy.vision, submitted_by=tenancy.acme_member, state="cancelled"
    )
    elsewhere = PoolRequestFactory.create_batch(
        3, project=other, submitted_by=tenancy.acme_member, state="queued"
    )

    _, page = queries(client, list_url("tenant-requests", state="queued", project="vision"))
    assert page.count(REQUEST_ROW) == 50 and page.count('class="badge request-queued"') == 50
    assert "?state=queued&amp;project=vision&amp;page=2" in page
    _, page = queries(client, list_url("tenant-requests", state="queued", project="vision", page=2))
    assert page.count(REQUEST_ROW) == 5
    assert f"#{queued[0].pk}<" in page and f"#{elsewhere[0].pk}<" not in page

    _, page = queries(client, list_url("tenant-requests", project="speech"))
    assert page.count(REQUEST_ROW) == 3 and "Speech" in page
    _, page = queries(client, list_url("tenant-requests", state="rejected"))
    assert page.count(REQUEST_ROW) == 0 and "Nothing matches these filters." in page

    PoolFactory.create_batch(2, project=other, request__submitted_by=tenancy.acme_member, state="released")
    PoolFactory.create_batch(3, project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    _, page = queries(client, list_url("tenant-pools", state="released"))
    assert page.count('class="badge pool-released"') == 2 and page.count(POOL_ROW) == 2
    _, page = queries(client, list_url("tenant-pools", project="vision"))
    assert page.count('class="badge pool-active"') == 3 and page.count(POOL_ROW) == 3


@pytest.mark.parametrize("name", ["tenant-requests", "tenant-pools"])
@pytest.mark.parametrize(
    "query",
    [{"state": "no-such-state"}, {"project": "recsys"}, {"project": "no-such-project"}],
    ids=["unknown state", "another tenant's project", "unknown project"],
)
def test_filters_that_do_not_hold_answer_400_and_say_why(name, query, tenancy, client):
    client.force_login(tenancy.acme_member)
    PoolRequestFactory(project=tenancy.recsys, submitted_by=tenancy.globex_member)
    PoolFactory(project=tenancy.recsys, request__submitted_by=tenancy.globex_member)
    PoolRequestFactory(project=tenancy.vision, submitted_by=tenancy.acme_member)
    _, page = queries(client, list_url(name, **query), status=400)
    assert "Select a valid choice." in page
    assert REQUEST_ROW not in page and POOL_ROW not in page


@pytest.mark.parametrize("name", ["tenant-requests", "tenant-pools"])
def test_a_tenant_list_shows_only_that_tenant_to_those_who_may_see_it(name, tenancy, staff_user, client):
    acme_pool = PoolFactory(project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    globex_pool = PoolFactory(project=tenancy.recsys, request__submitted_by=tenancy.globex_member)
    for who in (tenancy.globex_member, tenancy.outsider):
        client.force_login(who)
        assert client.get(list_url(name)).status_code == 404
    for who in (tenancy.acme_viewer, staff_user("approver")):  # a viewer, and staff who see every tenant
        client.force_login(who)
        _, page = queries(client, list_url(name))
        shown = acme_pool.pk if name == "tenant-pools" else acme_pool.request_id
        hidden = globex_pool.pk if name == "tenant-pools" else globex_pool.request_id
        assert f"#{shown}<" in page and f"#{hidden}<" not in page
    client.force_login(UserFactory(username="plain-staff", is_staff=True))  # staff, but no tenant seen
    assert client.get(list_url(name)).status_code == 404
    client.logout()
    assert client.get(list_url(name)).status_code == 302  # to sign in


@pytest.mark.parametrize("name", ["tenant-requests", "tenant-pools"])
def test_a_tenant_list_runs_a_constant_number_of_queries(name, tenancy, client):
    client.force_login(tenancy.acme_member)
    other = ProjectFactory(tenant=tenancy.acme, slug="speech")
    PoolRequestFactory.create_batch(
        2, project=tenancy.vision, submitted_by=tenancy.acme_member, state="queued"
    )
    PoolFactory.create_batch(2, project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    few, _ = queries(client, list_url(name))
    for project in (tenancy.vision, other):
        PoolRequestFactory.create_batch(40, project=project, submitted_by=UserFactory(), state="queued")
        PoolFactory.create_batch(40, project=project, request__submitted_by=UserFactory())
    many, page = queries(client, list_url(name))
    assert many == few
    assert page.count(REQUEST_ROW if name == "tenant-requests" else POOL_ROW) == 50


def test_waiting_requests_show_their_queue_position_and_reason(tenancy, client):
    client.force_login(tenancy.acme_member)
    _, second = PoolRequestFactory.create_batch(
        2, project=tenancy.vision, submitted_by=tenancy.acme_member, state="queued"
    )
    PoolRequest.objects.filter(pk=second.pk).update(waiting_reason="no H100-80GB GPU is free")
    _, page = queries(client, list_url("tenant-requests"))
    assert "<td>#1</td>" in page
    assert '<td>#2 <span class="muted">· no H100-80GB GPU is free</span></td>' in page


def test_the_tenant_and_project_pages_link_to_the_lists(tenancy, client):
    client.force_login(tenancy.acme_viewer)
    page = client.get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    assert list_url("tenant-requests") in page and list_url("tenant-pools") in page


# --- the admin -----------------------------------------------------------------------------------


def _our_model_admins():
    return [
        (model._meta.label, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in ("portal", "pools")
    ]


def test_every_changelist_of_ours_shows_fifty_rows_and_counts_once():
    found = _our_model_admins()
    assert {label.split(".")[0] for label, _ in found} == {"portal", "pools"}
    slow = [
        label
        for label, model_admin in found
        if model_admin.list_per_page != 50 or model_admin.show_full_result_count is not False
    ]
    assert slow == []


def test_the_pool_request_changelist_counts_once_and_shows_fifty(tenancy, client):
    superuser = UserFactory(username="root", is_staff=True, is_superuser=True)
    PoolRequestFactory.create_batch(60, project=tenancy.vision, submitted_by=tenancy.acme_member)
    client.force_login(superuser)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("admin:pools_poolrequest_changelist") + "?state__exact=submitted")
    assert response.status_code == 200
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1, counts
    assert len(response.context["cl"].result_list) == 50


@pytest.mark.parametrize("name", ["tenant-requests", "tenant-pools"])
def test_a_filled_list_holds_nothing_the_content_security_policy_refuses(name, tenancy, client):
    from tests.portal.test_csp import assert_hardened

    PoolFactory.create_batch(3, project=tenancy.vision, request__submitted_by=tenancy.acme_member)
    PoolRequestFactory.create_batch(
        60, project=tenancy.vision, submitted_by=tenancy.acme_member, state="queued"
    )
    client.force_login(tenancy.acme_member)
    assert_hardened(client.get(list_url(name, project="vision")))
    assert_hardened(client.get(list_url(name, state="no-such-state")), 400)
