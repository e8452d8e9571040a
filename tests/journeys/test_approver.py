"""Journey 2: an approver signs in with a password and a TOTP code, finds the tenant's requests, reads one's
placement preview and what the tenant already holds, approves it, and rejects another with a reason."""

import pytest
from django.contrib.auth.models import Group

from pools.models import Pool, PoolRequest
from pools.services import approve_request, submit_request
from pools.services.verdicts import verdicts
from tests.factories import UserFactory, enable_totp

from .conftest import JOURNEY, settle
from .test_tenant_member import FULL, MIG, until

pytestmark = JOURNEY


@pytest.fixture
def approver(db):
    user = UserFactory(username="carol", is_staff=True, totp=False)
    user.groups.add(Group.objects.get(name="approver"))
    return user, enable_totp(user)


@pytest.fixture
def asked(fleet, tenancy, approver, celery_worker):
    """acme holds one MIG instance already and asks for two more, and for a full GPU."""
    held = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[(MIG, 1)])
    approve_request(request_id=held.pk, approver=approver[0])
    pool = until(
        lambda: Pool.objects.filter(request=held, state="active").first(), "acme's pool is not active"
    )
    more = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[(MIG, 2)])
    full = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[(FULL, 1)], justification="a bigger model"
    )
    settle()
    return pool, more, full


def test_an_approver_approves_one_request_and_rejects_another(journey, approver, asked):
    page = journey.page
    held, more, full = asked
    journey.sign_in("carol", totp_secret=approver[1], next_url="/approvals/")
    assert page.url.endswith("/approvals/")
    for request in (more, full):
        assert page.locator(f"a[href='/approvals/{request.pk}/']").count() >= 1
    journey.shot("approvals")

    page.click(f"a[href='/approvals/{more.pk}/']")
    page.wait_for_url(f"**/approvals/{more.pk}/")
    journey.check_language()
    # The preview is the queue's own verdict: it fits now, on the GPU the engine picks.
    verdict = verdicts([PoolRequest.objects.get(pk=more.pk)])[more.pk]
    settle()
    assert verdict.outcome == "fits"
    preview = page.locator(".placement-preview")
    assert preview.locator(".badge.verdict-fits").count() == 1
    landings = preview.locator("ul").last.locator("li")
    assert landings.count() == len(verdict.landings) == 2
    for n, landing in enumerate(verdict.landings):
        assert str(landing.gpu) in landings.nth(n).inner_text()
    holdings = page.locator(".holdings tbody tr")
    assert holdings.count() == 1 and holdings.first.locator("td").first.inner_text() == f"#{held.pk}"
    journey.shot("preview")

    page.click(f"form[action='/approvals/{more.pk}/approve/'] button")
    page.wait_for_url("**/approvals/")  # back to the list, saying so
    journey.check_language()
    assert f"#{more.pk}" in page.locator(".messages .message.success").inner_text()
    placed = "the approved request was not placed"
    until(lambda: PoolRequest.objects.get(pk=more.pk).state == "fulfilled", placed)
    journey.shot("approved")

    page.goto(journey.url("approval", pk=full.pk))
    journey.check_language()
    page.fill("#id_reject_reason", "The budget of this quarter is spent.")
    journey.shot("rejecting")
    page.click(f"form[action='/approvals/{full.pk}/reject/'] button")
    page.wait_for_url("**/approvals/")
    assert page.locator(f"a[href='/approvals/{full.pk}/']").count() == 0  # decided: off the list
    page.goto(journey.url("approval", pk=full.pk))
    page.wait_for_selector("h1 .badge.request-rejected")
    journey.check_language()
    assert "The budget of this quarter is spent." in page.locator("main").inner_text()
    journey.shot("rejected")
    rejected = PoolRequest.objects.get(pk=full.pk)
    settle()
    assert (rejected.state, rejected.decision_reason) == ("rejected", "The budget of this quarter is spent.")
    assert not Pool.objects.filter(request=full).exists()
