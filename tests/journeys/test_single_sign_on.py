"""Journey 5: a person of a company that signs its people in through its identity provider: the portal's
sign-in page, the provider's own login page, back in the portal as a member of the tenant their group maps
to, and signed out of both."""

from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from portal.models import GroupRole, Membership
from tests.oidc.plugin import trust

from .conftest import JOURNEY, settle

pytestmark = [mark for mark in JOURNEY if mark.name != "celery"]


@pytest.fixture
def journey_other_hosts(idp) -> tuple[str, ...]:
    return (urlsplit(idp.issuer).netloc,)


@pytest.fixture
def corp_id(idp, live_server, settings, tenancy):
    """The portal trusting the test provider, acme's users group mapped to its members."""
    trust(settings, idp)
    idp.add_redirect_uri(f"{live_server.url}/accounts/oidc/oidc/login/callback/")
    idp.add_post_logout_redirect_uri(f"{live_server.url}{reverse('account_login')}")
    idp.set_account(
        "kim",
        password="corp-password",
        email="kim@corp.example",
        email_verified=True,
        name="Kim Jiwoo",
        given_name="Jiwoo",
        family_name="Kim",
        preferred_username="kim",
        groups=["acme-users"],
    )
    GroupRole.objects.create(group="acme-users", role="tenant:acme:member")
    settle()
    return idp


def test_a_person_signs_in_through_the_provider_and_out_of_both(journey, corp_id):
    page = journey.page
    journey.go("account_login")
    journey.shot("sign-in-page")
    page.click("button:has-text('Corp ID')")
    # The provider's own login page.
    page.wait_for_url(f"{corp_id.issuer}/interaction/**")
    journey.shot("provider-login")
    page.fill("input[name=login]", "kim")
    page.fill("input[name=password]", "corp-password")
    page.click("button[type=submit]")
    page.wait_for_url(f"{journey.base}/")
    journey.check_language()
    journey.go("tenant", slug="acme")
    assert "kim" in page.locator("main").inner_text()
    journey.shot("member-of-acme")
    settle()
    person = get_user_model().objects.get(username="kim")
    assert Membership.objects.get(user=person).provider_role == "member"
    settle()
    # Signing out here signs out at the provider too, and comes back to the sign-in page.
    page.click(f"form[action='{reverse('account_logout')}'] button")
    page.wait_for_url(f"{journey.base}{reverse('account_login')}*")
    journey.check_language()
    journey.shot("signed-out")
    # The provider's session is over: signing in again asks for the password again.
    page.click("button:has-text('Corp ID')")
    page.wait_for_url(f"{corp_id.issuer}/interaction/**")
