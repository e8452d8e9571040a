"""The approvers' workspace: the queue of requests to decide with the queue's own verdict on each, the
approved ones still waiting, one request's page with its decisions, and who may see any of it."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from pools.models import Pool, PoolEvent, PoolRequest, RequestState
from pools.services import admit_waiting, approve_request, fail_pool
from pools.services.verdicts import FITS, NEVER, WAITS, verdict
from tests.factories import PoolFactory, PoolRequestFactory, PriceFactory
from tests.pools.test_queue import ask

QUEUE = "/approvals/"


def page_of(pk: int, action: str = "") -> str:
    return f"/approvals/{pk}/{action + '/' if action else ''}"


def state_of(request: PoolRequest) -> tuple:
    request.refresh_from_db()
    return request.state, request.priority, request.decision_reason, request.events.count()


@pytest.fixture
def three(fleet, tenancy, approver):
    """Every H100 held by an admitted request; then, in this order, a request that fits now (an H200), one
    that waits (an H100) and one that can never fit (nine H100 of a cluster that has eight)."""
    hog = ask(tenancy, [("h100-80gb.full", 8)])
    approve_request(request_id=hog.pk, approver=approver)
    admit_waiting()
    fits = ask(tenancy, [("h200-141gb.full", 1)])
    waits = ask(tenancy, [("h100-80gb.full", 1)])
    # Submitting checks what could ever fit, so this one is as a fleet that has since shrunk leaves it.
    never = PoolRequestFactory(project=tenancy.vision, items=[("h100-80gb.full", 9)])
    return hog, fits, waits, never


def test_the_queue_lists_requests_to_decide_oldest_first_with_the_queues_verdict(three, client_for, approver):
    _hog, fits, waits, never = three
    response = client_for(approver).get(QUEUE)
    assert response.status_code == 200
    rows = list(response.context["page"].object_list)
    assert [r.pk for r in rows] == [fits.pk, waits.pk, never.pk]  # oldest first; the approved hog is not here
    verdicts = response.context["verdicts"]
    assert [verdicts[r.pk].outcome for r in rows] == [FITS, WAITS, NEVER]
    assert verdicts[fits.pk].cluster == "sim"
    assert str(verdicts[waits.pk].reason) == "needs 1 × full H100-80GB; 0 free"
    assert str(verdicts[never.pk].reason) == "needs 9 × full H100-80GB; 8 free"
    body = response.content.decode()
    for shown in ("fits now", "waits", "never fits", "needs 1 × full H100-80GB; 0 free", "Acme", "alice"):
        assert shown in body
    assert "1 × H200-141GB full" in body  # items as people read them
    assert f'href="{page_of(fits.pk)}"' in body


def test_the_verdicts_agree_with_what_the_queue_then_does(three, approver):
    hog, fits, waits, never = three
    said = {r.pk: verdict(r) for r in (fits, waits, never)}
    for request in (fits, waits, never):
        approve_request(request_id=request.pk, approver=approver)
    results = {r.request_id: r for r in admit_waiting()}
    assert results[fits.pk].admitted  # fits now: admitted at once
    assert not results[waits.pk].admitted and not results[never.pk].admitted
    waits.refresh_from_db()
    assert waits.state == RequestState.QUEUED and waits.waiting_reason == str(said[waits.pk].reason)

    fail_pool(pool_id=Pool.objects.get(request=hog).pk, reason="given back")  # every H100 free again
    results = {r.request_id: r for r in admit_waiting()}
    assert results[waits.pk].admitted  # it only waited
    never.refresh_from_db()
    assert not results[never.pk].admitted and never.state == RequestState.QUEUED  # it never will
    assert verdict(never).outcome == NEVER


def test_approved_requests_still_waiting_show_their_position_reason_and_priority(three, client_for, approver):
    _hog, _fits, waits, never = three
    approve_request(request_id=waits.pk, approver=approver, priority=5)
    approve_request(request_id=never.pk, approver=approver)
    admit_waiting()
    response = client_for(approver).get(QUEUE, {"tab": "queue"})
    assert response.status_code == 200
    rows = list(response.context["page"].object_list)
    assert [r.pk for r in rows] == [waits.pk, never.pk]  # queue order: priority first
    assert response.context["positions"] == {waits.pk: 1, never.pk: 2}
    body = response.content.decode()
    assert "needs 1 × full H100-80GB; 0 free" in body and "needs 9 × full H100-80GB; 0 free" in body
    assert '<td class="num">5</td>' in body
    assert client_for(approver).get(QUEUE, {"tab": "other"}).status_code == 400


def test_approve_from_the_page(fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    client = client_for(approver)
    assert client.get(page_of(request.pk)).status_code == 200
    response = client.post(page_of(request.pk, "approve"), {"priority": ""})
    assert response.status_code == 302 and response["Location"] == QUEUE
    request.refresh_from_db()
    assert request.state == RequestState.APPROVED and request.decided_by == approver
    assert request.priority == 0
    assert request.events.filter(to_state=RequestState.APPROVED, actor=approver).exists()


def test_approve_with_a_priority(fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    response = client_for(approver).post(page_of(request.pk, "approve"), {"priority": "40"})
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.state == RequestState.APPROVED and request.priority == 40


@pytest.mark.parametrize(
    ("priority", "message"), [("abc", "Enter a whole number."), ("5000", "Priority goes from -1000 to 1000.")]
)
def test_a_bad_priority_is_a_400_and_nothing_changes(priority, message, fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    before = state_of(request)
    response = client_for(approver).post(page_of(request.pk, "approve"), {"priority": priority})
    assert response.status_code == 400 and message in response.content.decode()
    assert state_of(request) == before


def test_reject_with_a_reason(fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    response = client_for(approver).post(page_of(request.pk, "reject"), {"reason": "Use the shared pool."})
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.state == RequestState.REJECTED and request.decision_reason == "Use the shared pool."
    assert request.events.get(to_state=RequestState.REJECTED).reason == "Use the shared pool."


@pytest.mark.parametrize("reason", ["", "   \n"])
def test_reject_without_a_reason_is_refused_and_nothing_changes(reason, fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    before = state_of(request)
    response = client_for(approver).post(page_of(request.pk, "reject"), {"reason": reason})
    assert response.status_code == 400
    assert "Say why the request is rejected" in response.content.decode()
    assert state_of(request) == before == (RequestState.SUBMITTED, 0, "", 1)


def test_set_the_priority_of_an_approved_request(three, tenancy, client_for, approver):
    _hog, _fits, waits, _never = three
    approve_request(request_id=waits.pk, approver=approver)
    admit_waiting()
    client = client_for(approver)
    page = client.get(page_of(waits.pk)).content.decode()
    assert (
        "Set priority" in page
        and "Approve" not in page.split('class="card decide"')[1].split("</section>")[0]
    )
    response = client.post(page_of(waits.pk, "priority"), {"priority": "-20"})
    assert response.status_code == 302 and response["Location"] == page_of(waits.pk)
    waits.refresh_from_db()
    assert waits.priority == -20 and waits.state == RequestState.QUEUED
    assert PoolEvent.objects.filter(request=waits, reason="priority set to -20").exists()
    before = state_of(waits)
    assert client.post(page_of(waits.pk, "priority"), {"priority": ""}).status_code == 400
    assert state_of(waits) == before


def test_a_refusal_of_the_service_is_shown_with_its_status(fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    approve_request(request_id=request.pk, approver=approver)
    before = state_of(request)
    response = client_for(approver).post(page_of(request.pk, "approve"), {})
    assert response.status_code == 409
    assert state_of(request) == before


def test_the_page_previews_the_placement_and_shows_the_tenants_holdings(three, tenancy, client_for, approver):
    hog, fits, _waits, never = three
    client = client_for(approver)
    body = client.get(page_of(fits.pk)).content.decode()
    assert "fits now" in body and "on sim" in body and "→ h200-" in body
    held = Pool.objects.get(request=hog)
    assert f"#{held.pk}" in body and "8 × H100-80GB full" in body and "Vision" in body  # what acme holds
    assert "8 × H100-80GB full" not in client.get(page_of(PoolRequestFactory().pk)).content.decode()
    assert "never fits" in client.get(page_of(never.pk)).content.decode()
    assert f'href="{reverse("admin:pools_poolrequest_change", args=[fits.pk])}"' in body


NOW = datetime(2026, 11, 10, 3, tzinfo=UTC)


def test_the_page_shows_what_the_tenant_spends_as_billing_computes_it(
    tenancy, client_for, approver, monkeypatch
):
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=NOW - timedelta(days=60),
    )
    PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOW - timedelta(hours=5),
    )
    request = PoolRequestFactory(project=tenancy.vision)
    body = client_for(approver).get(page_of(request.pk)).content.decode()
    assert "What Acme spends in 2026-11" in body
    # as on the tenant's own page (tests/billing/test_spend.py): to date, per hour, projected to month's end
    for figure in ("42,000", "8,400", f"{2 * 4200 * (5 + 492):,}"):
        assert figure in body


def test_the_top_bar_counts_the_requests_to_decide_in_one_query(
    fleet, tenancy, client_for, approver, django_assert_num_queries
):
    from pools.views.approvals import awaiting_count

    for _ in range(3):
        ask(tenancy, [("h100-80gb.full", 1)])
    approve_request(request_id=PoolRequest.objects.first().pk, approver=approver)
    with django_assert_num_queries(1):
        assert awaiting_count(approver) == 2
    body = client_for(approver).get(QUEUE).content.decode()
    assert '<a href="/approvals/">Approvals <span class="nav-count">2</span></a>' in body
    assert awaiting_count(tenancy.acme_member) == 0
    assert "/approvals/" not in client_for(tenancy.acme_member).get("/").content.decode()


def test_the_queue_reads_a_fixed_number_of_queries(
    fleet, tenancy, client_for, approver, django_assert_max_num_queries
):
    client = client_for(approver)
    ask(tenancy, [("h100-80gb.full", 1)])
    client.get(QUEUE)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        client.get(QUEUE)
    for _ in range(6):
        ask(tenancy, [("h100-80gb.full", 1)])
    with django_assert_max_num_queries(len(few)):
        client.get(QUEUE)


@pytest.mark.parametrize("who", ["acme_admin", "acme_member", "globex_member", "outsider"])
def test_tenants_get_404_everywhere(who, tenancy, client_for):
    request = PoolRequestFactory(project=tenancy.vision)
    client = client_for(getattr(tenancy, who))
    before = state_of(request)
    for url in (QUEUE, page_of(request.pk)):
        assert client.get(url).status_code == 404
    for action, data in (("approve", {}), ("reject", {"reason": "no"}), ("priority", {"priority": "3"})):
        assert client.post(page_of(request.pk, action), data).status_code == 404
    assert state_of(request) == before


@pytest.mark.parametrize("group", ["operator", "finance"])
def test_staff_without_the_permission_get_404(group, tenancy, client_for, staff_user):
    request = PoolRequestFactory(project=tenancy.vision)
    client = client_for(staff_user(group))
    before = state_of(request)
    assert client.get(QUEUE).status_code == 404
    assert client.get(page_of(request.pk)).status_code == 404
    assert client.post(page_of(request.pk, "approve"), {}).status_code == 404
    assert state_of(request) == before


def test_an_unknown_request_is_404(client_for, approver):
    assert client_for(approver).get(page_of(999999)).status_code == 404
    assert client_for(approver).post(page_of(999999, "reject"), {"reason": "x"}).status_code == 404


def test_the_admins_request_page_links_to_the_approvals_page(fleet, tenancy, client_for, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    body = client_for(approver).get(f"/admin/pools/poolrequest/{request.pk}/change/").content.decode()
    assert f'href="{page_of(request.pk)}"' in body
    assert "Fits now on sim:" in body  # the admin's preview reads the same verdict


def test_the_admin_and_the_approvals_page_link_each_other_for_approvers_only(
    fleet, tenancy, approver, operator, client
):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    change = f"/admin/pools/poolrequest/{request.pk}/change/"
    client.force_login(approver)
    assert "Decide on the approvals page" in client.get(change).content.decode()
    assert change in client.get(reverse("approval", args=[request.pk])).content.decode()
    client.force_login(operator)  # reads requests in the admin, decides none
    shown = client.get(change)
    assert shown.status_code == 200 and "Decide on the approvals page" not in shown.content.decode()
