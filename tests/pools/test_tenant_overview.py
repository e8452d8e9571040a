"""The tenant overview: the tenant page's live pools and waiting requests (why each waits, where it stands
in the queue), the home page's figures of each tenant, and pages of work in between that refresh themselves
until it settles."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pools import selectors
from pools.models import PoolEvent, PoolRequest
from pools.services import admit_waiting, approve_request, submit_request
from pools.services.inventory import sync_inventory
from portal.models import Role
from tests.factories import (
    MembershipFactory,
    PoolFactory,
    PoolRequestFactory,
    ProjectFactory,
    TenantFactory,
    UserFactory,
)

REFRESHING = re.compile(r'id="(?P<id>[\w-]+)" data-refresh="\d+"')


def tenant_url(slug: str = "acme") -> str:
    return reverse("tenant", kwargs={"slug": slug})


def get(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content.decode()[:500]
    return response.content.decode()


def section(page: str) -> str:
    """The tenant page's GPU part."""
    start = page.index('id="tenant-gpu-pools"')
    return page[start : page.index("</section>", start)]


def pool_link(pool) -> str:
    return f'href="{reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})}"'


def request_link(request) -> str:
    return f'href="{reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": request.pk})}"'


def refreshing(page: str) -> set[str]:
    """Ids of the regions of a page that refresh themselves."""
    return {match["id"] for match in REFRESHING.finditer(page)}


# --- what the tenant page shows --------------------------------------------------------------------------


@pytest.fixture
def fleet(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    return sim_cluster


def test_the_tenant_page_shows_live_pools_and_waiting_requests_with_the_queues_reason(
    fleet, tenancy, staff_user, client_for
):
    approver = staff_user("approver")
    # Every full H100 of the fleet goes to one request; the next one waits in the queue for room.
    first = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 8)])
    waiting = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    undecided = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-1g.18gb", 2)]
    )
    for request in (first, waiting):
        approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    waiting.refresh_from_db()
    assert waiting.state == "queued" and waiting.waiting_reason
    pool = PoolRequest.objects.get(pk=first.pk).pool
    released = PoolFactory(project=tenancy.vision, state="released")

    part = section(get(client_for(tenancy.acme_viewer), tenant_url()))
    assert pool_link(pool) in part and "8 × H100-80GB full" in part and tenancy.vision.name in part
    assert 'class="badge pool-provisioning"' in part and pool_link(released) not in part
    assert request_link(waiting) in part and request_link(undecided) in part
    assert request_link(first) not in part
    # Why it waits and where it stands: the words and the number the request's own page shows.
    position = selectors.queue_positions()[waiting.pk]
    assert f'#{position} <span class="muted">· {selectors.waiting_reason(waiting)}</span>' in part
    assert "2 × H200-141GB 1g.18gb" in part
    assert reverse("tenant-pools", kwargs={"tenant_slug": "acme"}) in part
    assert reverse("tenant-requests", kwargs={"tenant_slug": "acme"}) in part


def test_since_is_when_the_pool_entered_its_state(tenancy, client_for):
    reserved = timezone.now() - timedelta(days=3)
    pool = PoolFactory(project=tenancy.vision, state="releasing", reserved_at=reserved)
    PoolEvent.objects.create(request=pool.request, pool=pool, from_state="active", to_state="releasing")
    PoolEvent.objects.filter(pool=pool).update(at=reserved + timedelta(days=2, hours=5))
    quiet = PoolFactory(project=tenancy.vision, state="active", reserved_at=reserved + timedelta(hours=1))
    found = {
        p.pk: p.since for p in selectors.tenant_live_pools(user=tenancy.acme_member, tenant=tenancy.acme)
    }
    assert found == {pool.pk: reserved + timedelta(days=2, hours=5), quiet.pk: quiet.active_at}
    part = section(get(client_for(tenancy.acme_member), tenant_url()))
    assert timezone.localtime(found[pool.pk]).strftime("%Y-%m-%d %H:%M") in part


def test_the_section_shows_the_newest_ten_of_each_and_links_to_the_rest(tenancy, client_for):
    made = [
        PoolFactory(project=tenancy.vision, reserved_at=timezone.now() - timedelta(minutes=n))
        for n in range(12)
    ]
    asked = PoolRequestFactory.create_batch(11, project=tenancy.vision, state="queued")
    part = section(get(client_for(tenancy.acme_member), tenant_url()))
    assert part.count('class="badge pool-active"') == 10
    assert part.count('class="badge request-queued"') == 10
    assert pool_link(made[0]) in part and pool_link(made[-1]) not in part
    assert request_link(asked[-1]) in part and request_link(asked[0]) not in part
    assert part.count("Showing the newest 10.") == 2


def test_the_section_shows_only_the_tenants_own_and_what_the_viewer_may_see(tenancy, staff_user):
    ours = PoolFactory(project=tenancy.vision)
    theirs = PoolFactory(project=tenancy.recsys)
    waiting = PoolRequestFactory(project=tenancy.recsys, state="approved")
    assert list(selectors.tenant_live_pools(user=tenancy.acme_member, tenant=tenancy.acme)) == [ours]
    assert not selectors.tenant_live_pools(user=tenancy.acme_member, tenant=tenancy.globex).exists()
    assert not selectors.tenant_waiting_requests(user=tenancy.acme_member, tenant=tenancy.globex).exists()
    # Platform staff who see every tenant see its rows; someone outside it sees none even when asked.
    approver = staff_user("approver")
    assert list(selectors.tenant_live_pools(user=approver, tenant=tenancy.globex)) == [theirs]
    assert list(selectors.tenant_waiting_requests(user=approver, tenant=tenancy.globex)) == [waiting]
    assert not selectors.tenant_live_pools(user=tenancy.outsider, tenant=tenancy.acme).exists()


def test_a_tenant_with_nothing_live_says_so(tenancy, client_for):
    PoolFactory(project=tenancy.vision, state="released")
    PoolRequestFactory(project=tenancy.vision, state="rejected")
    part = section(get(client_for(tenancy.acme_member), tenant_url()))
    assert "No pool holds GPUs now." in part and "No request waits." in part


def test_the_tenant_page_does_not_query_per_row(tenancy, client_for):
    client = client_for(tenancy.acme_member)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            get(client, tenant_url())
        return len(captured)

    PoolFactory(project=tenancy.vision, state="provisioning")
    PoolRequestFactory(project=tenancy.vision, state="queued")
    few = queries()
    for _ in range(6):
        other = ProjectFactory(tenant=tenancy.acme)
        PoolFactory(project=other, state="releasing", request__items=[("h100-80gb.full", 2)])
        PoolRequestFactory(project=other, state="submitted")
    assert queries() == few


# --- the home page ---------------------------------------------------------------------------------------


def test_the_home_page_counts_live_pools_and_waiting_requests_of_each_tenant(tenancy, client_for):
    PoolFactory.create_batch(2, project=tenancy.vision)
    PoolFactory(project=tenancy.vision, state="provisioning")
    PoolFactory(project=tenancy.vision, state="released")
    PoolRequestFactory(project=tenancy.vision, state="submitted")
    PoolRequestFactory(project=tenancy.vision, state="rejected")
    PoolFactory(project=tenancy.recsys)  # globex's, which alice does not belong to
    MembershipFactory(user=tenancy.acme_member, tenant=tenancy.globex, role=Role.VIEWER)
    PoolRequestFactory.create_batch(4, project=tenancy.recsys, state="queued")

    page = get(client_for(tenancy.acme_member), reverse("home"))
    acme, globex = page[page.index(">Acme<") :], page[page.index(">Globex<") :]
    assert "<strong>3</strong> live pools" in acme and "<strong>1</strong> request waiting" in acme
    assert "<strong>1</strong> live pool<" in globex and "<strong>4</strong> requests waiting" in globex
    assert f'href="{tenant_url()}#tenant-gpu-pools"' in page


def test_the_home_page_counts_in_one_query_for_all_tenants(db, client_for):
    user = UserFactory()
    client = client_for(user)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            get(client, reverse("home"))
        return len(captured)

    def tenant_with_work():
        tenant = TenantFactory()
        MembershipFactory(user=user, tenant=tenant)
        PoolFactory(project__tenant=tenant)
        PoolRequestFactory(project__tenant=tenant, state="queued")

    tenant_with_work()
    few = queries()
    for _ in range(5):
        tenant_with_work()
    assert queries() == few


# --- pages that refresh themselves while work is in between ------------------------------------------


@pytest.mark.parametrize(
    ("state", "refreshes"),
    [
        ("submitted", True),
        ("approved", True),
        ("queued", True),
        ("fulfilled", False),
        ("rejected", False),
        ("cancelled", False),
    ],
)
def test_the_request_page_refreshes_while_the_request_waits(state, refreshes, tenancy, client_for):
    request = PoolRequestFactory(project=tenancy.vision, state=state)
    page = get(
        client_for(tenancy.acme_member),
        reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": request.pk}),
    )
    assert 'id="request-live"' in page
    assert refreshing(page) == ({"request-live"} if refreshes else set())


@pytest.mark.parametrize(
    ("state", "refreshes"),
    [("provisioning", True), ("releasing", True), ("active", False), ("released", False), ("failed", False)],
)
def test_the_pool_page_refreshes_while_the_pool_moves(state, refreshes, tenancy, client_for):
    pool = PoolFactory(project=tenancy.vision, state=state)
    page = get(
        client_for(tenancy.acme_member), reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})
    )
    assert 'id="pool-live"' in page
    assert refreshing(page) == ({"pool-live"} if refreshes else set())


def test_the_tenant_section_refreshes_while_something_waits_or_moves(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    active = PoolFactory(project=tenancy.vision, state="active")
    assert refreshing(get(client, tenant_url())) == set()

    waiting = PoolRequestFactory(project=tenancy.vision, state="submitted")
    assert refreshing(get(client, tenant_url())) == {"tenant-gpu-pools"}
    PoolRequest.objects.filter(pk=waiting.pk).update(state="cancelled")
    assert refreshing(get(client, tenant_url())) == set()

    for moving in ("provisioning", "releasing"):
        type(active).objects.filter(pk=active.pk).update(state=moving)
        assert refreshing(get(client, tenant_url())) == {"tenant-gpu-pools"}
    type(active).objects.filter(pk=active.pk).update(state="released", released_at=timezone.now())
    assert refreshing(get(client, tenant_url())) == set()


def test_the_tenants_lists_refresh_while_a_row_is_in_between(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    requests_url = reverse("tenant-requests", kwargs={"tenant_slug": "acme"})
    pools_url = reverse("tenant-pools", kwargs={"tenant_slug": "acme"})
    PoolFactory(project=tenancy.vision, state="active")  # its request is fulfilled
    assert refreshing(get(client, requests_url)) == set()
    assert refreshing(get(client, pools_url)) == set()

    request = PoolRequestFactory(project=tenancy.vision, state="queued")
    pool = PoolFactory(project=tenancy.vision, state="provisioning")
    assert refreshing(get(client, requests_url)) == {"requests-rows"}
    assert refreshing(get(client, pools_url)) == {"pools-rows"}
    # Filtered to rows that are settled, the page has nothing in between.
    assert refreshing(get(client, requests_url + "?state=fulfilled")) == set()
    assert refreshing(get(client, pools_url + "?state=active")) == set()

    PoolRequest.objects.filter(pk=request.pk).update(state="rejected")
    type(pool).objects.filter(pk=pool.pk).update(state="active", active_at=timezone.now())
    assert refreshing(get(client, requests_url)) == set()
    assert refreshing(get(client, pools_url)) == set()


def test_a_list_refused_for_its_filters_does_not_refresh(tenancy, client_for):
    PoolRequestFactory(project=tenancy.vision, state="queued")
    response = client_for(tenancy.acme_member).get(
        reverse("tenant-requests", kwargs={"tenant_slug": "acme"}) + "?state=nonsense"
    )
    assert response.status_code == 400 and refreshing(response.content.decode()) == set()
