"""Signing in through a real OpenID Connect provider (tests/oidc: node-oidc-provider, started as a process):
people made on their first sign-in with the roles their groups map to, roles following the groups, a second
factor at the provider, signing out there, and every bad answer refused with nothing created or changed."""

import pytest
from allauth.account.models import EmailAddress
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from portal.models import AuditEntry, GroupRole, Membership, Role
from portal.sso import errors
from tests.factories import UserFactory
from tests.oidc.plugin import sign_in, sign_out_at_provider, trust

User = get_user_model()
SIGNED_IN = "/"  # LOGIN_REDIRECT_URL


@pytest.fixture
def sso(idp, settings, tenancy):
    """The portal trusting the test provider (its groups asked for), with acme's and the approvers' groups
    mapped."""
    trust(settings, idp, OIDC_MFA_ACR="phr")
    settings.STAFF_REQUIRE_TOTP = True
    idp.add_post_logout_redirect_uri("http://testserver/accounts/login/")
    GroupRole.objects.create(group="acme-users", role="tenant:acme:member")
    GroupRole.objects.create(group="acme-admins", role="tenant:acme:admin")
    GroupRole.objects.create(group="gpu-approvers", role="approver")
    return idp


def kim(idp, **claims):
    idp.set_account(
        "kim",
        **{
            "email": "kim@corp.example",
            "email_verified": True,
            "name": "Kim Jiwoo",
            "given_name": "Jiwoo",
            "family_name": "Kim",
            "preferred_username": "kim",
            "groups": ["acme-users"],
            **claims,
        },
    )


def signed_in_user(client: Client):
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


def assert_refused(response, message) -> None:
    assert response.status_code == 403
    page = response.content.decode()
    assert "Sign-in refused" in page
    assert str(message).split(".")[0].replace("'", "&#x27;") in page


# --- the first sign-in and the next ones ------------------------------------------------------------------


def test_the_sign_in_page_offers_the_provider(sso, client):
    page = client.get(reverse("account_login")).content.decode()
    assert "Sign in with Corp ID" in page
    assert 'action="/accounts/oidc/oidc/login/?process=login"' in page


def test_a_first_sign_in_makes_the_person_with_the_roles_of_their_groups(sso, client):
    kim(sso)
    response = sign_in(client, sso, "kim")
    assert (response.status_code, response["Location"]) == (302, SIGNED_IN)
    person = signed_in_user(client)
    assert (person.username, person.email, person.first_name, person.last_name) == (
        "kim",
        "kim@corp.example",
        "Jiwoo",
        "Kim",
    )
    assert not person.has_usable_password()
    assert EmailAddress.objects.get(user=person).verified
    assert SocialAccount.objects.get(user=person).uid == "kim"
    membership = Membership.objects.get(user=person)
    assert (membership.tenant.slug, membership.role, membership.provider_role) == ("acme", "member", "member")
    assert AuditEntry.objects.filter(
        action="access.provider_role_given", tenant_id=membership.tenant_id
    ).exists()
    assert client.get(reverse("tenant", kwargs={"slug": "acme"})).status_code == 200


def test_a_changed_group_changes_the_roles_at_the_next_sign_in(sso, client):
    kim(sso, groups=["acme-users", "gpu-approvers"], amr=["pwd", "mfa"])
    sign_in(client, sso, "kim")
    person = signed_in_user(client)
    assert person.is_staff and person.groups.filter(name="approver").exists()
    kim(sso, groups=["acme-admins"])
    sso.forget_session()
    again = Client()
    assert sign_in(again, sso, "kim")["Location"] == SIGNED_IN
    person.refresh_from_db()
    assert not person.is_staff and not person.groups.exists()
    assert Membership.objects.get(user=person).role == Role.ADMIN
    assert User.objects.filter(email="kim@corp.example").count() == 1


def test_an_address_both_sides_verified_joins_the_existing_account(sso, tenancy, client):
    alice = tenancy.acme_member
    EmailAddress.objects.create(user=alice, email=alice.email, verified=True, primary=True)
    sso.set_account("a.lee", email=alice.email, email_verified=True, groups=[])
    assert sign_in(client, sso, "a.lee")["Location"] == SIGNED_IN
    assert signed_in_user(client) == alice
    assert SocialAccount.objects.get(uid="a.lee").user == alice
    # Her role in acme was given by hand: a sign-in with no group for it leaves it.
    assert Membership.objects.get(user=alice, tenant=tenancy.acme).role == Role.MEMBER


def test_a_person_signed_in_only_through_the_provider_makes_api_tokens(sso, client):
    kim(sso)
    sign_in(client, sso, "kim")
    page = client.post(reverse("api-tokens"), {"name": "laptop"})
    assert page.status_code == 200
    key = page.context["issued"].key
    answer = Client().get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Token {key}")
    assert answer.status_code == 200
    assert [p["slug"] for p in answer.json()["results"]] == ["vision"]


# --- a second factor ------------------------------------------------------------------------------------


def test_staff_whose_provider_asked_a_second_factor_are_not_asked_for_totp(sso, client):
    kim(sso, groups=["gpu-approvers"], amr=["pwd", "mfa"])
    sign_in(client, sso, "kim")
    assert client.get("/approvals/").status_code == 200


def test_a_configured_acr_counts_as_a_second_factor(sso, client):
    kim(sso, groups=["gpu-approvers"], acr="phr")
    sign_in(client, sso, "kim")
    assert client.get("/approvals/").status_code == 200


def test_staff_without_a_second_factor_at_the_provider_keep_the_totp_rule(sso, client):
    kim(sso, groups=["gpu-approvers"])
    assert sign_in(client, sso, "kim")["Location"] == SIGNED_IN
    answer = client.get("/approvals/")
    assert (answer.status_code, answer["Location"]) == (302, reverse("mfa_activate_totp"))


def test_a_person_with_totp_is_asked_for_it_unless_the_provider_asked_a_second_factor(sso, client):
    person = UserFactory(username="kim-local", email="kim@corp.example", verified_email=True, totp=True)
    kim(sso)
    answer = sign_in(client, sso, "kim")
    assert answer["Location"] == reverse("mfa_authenticate")
    assert signed_in_user(client) is None
    kim(sso, amr=["pwd", "mfa"])
    sso.forget_session()
    other = Client()
    assert sign_in(other, sso, "kim")["Location"] == SIGNED_IN
    assert signed_in_user(other) == person


# --- signing out ----------------------------------------------------------------------------------------


def test_signing_out_ends_the_providers_session_too(sso, client):
    kim(sso)
    sign_in(client, sso, "kim")
    answer = client.post(reverse("account_logout"))
    assert answer["Location"].startswith(sso.end_session_endpoint)
    assert "id_token_hint=" in answer["Location"]
    assert signed_in_user(client) is None
    assert sign_out_at_provider(sso, answer["Location"]) == "http://testserver/accounts/login/"
    # The provider asks for the password again: its session is over.
    sign_in(Client(), sso, "kim")
    assert any("/interaction/" in url for url in sso.visited)


# --- refused --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("issuer", errors.WRONG_ISSUER),
        ("audience", errors.WRONG_AUDIENCE),
        ("expired", errors.EXPIRED),
        ("signature", errors.BAD_SIGNATURE),
        ("unsigned", errors.BAD_SIGNATURE),
        ("replay", errors.REPLAYED),
    ],
)
def test_a_bad_id_token_is_refused_and_nothing_is_made(sso, client, tamper, message):
    kim(sso)
    if tamper == "replay":  # an earlier sign-in's token, with that sign-in's nonce
        sign_in(Client(), sso, "kim")
        SocialAccount.objects.all().delete()
        User.objects.filter(username="kim").delete()
    sso.tamper(tamper)
    before = (User.objects.count(), Membership.objects.count(), SocialAccount.objects.count())
    assert_refused(sign_in(client, sso, "kim"), message)
    assert signed_in_user(client) is None
    assert (User.objects.count(), Membership.objects.count(), SocialAccount.objects.count()) == before


def test_a_replayed_state_is_refused(sso, client):
    kim(sso)
    first = sign_in(client, sso, "kim")
    assert first["Location"] == SIGNED_IN
    callback = sso.visited[-1].removeprefix("http://testserver")
    again = Client()
    assert_refused(again.get(callback), errors.REPLAYED)
    assert signed_in_user(again) is None


def test_an_unverified_address_of_an_existing_account_is_refused(sso, tenancy, client):
    alice = tenancy.acme_member
    EmailAddress.objects.create(user=alice, email=alice.email, verified=True, primary=True)
    sso.set_account("mallet", email=alice.email, email_verified=False, groups=["acme-admins"])
    assert_refused(sign_in(client, sso, "mallet"), errors.UNVERIFIED_EMAIL % {"email": alice.email})
    assert not SocialAccount.objects.exists()
    assert Membership.objects.get(user=alice, tenant=tenancy.acme).role == Role.MEMBER
    assert not User.objects.filter(username="mallet").exists()


def test_an_address_never_verified_here_is_not_joined(sso, tenancy, client):
    sso.set_account("b.park", email=tenancy.acme_admin.email, email_verified=True)
    assert_refused(
        sign_in(client, sso, "b.park"), errors.UNVERIFIED_HERE % {"email": tenancy.acme_admin.email}
    )
    assert not SocialAccount.objects.exists()


@pytest.mark.parametrize("groups", ["acme-admins", {"acme-admins": True}, ["acme-admins", 7]])
def test_a_group_claim_of_the_wrong_type_is_refused(sso, client, groups):
    kim(sso, groups=groups)
    assert_refused(sign_in(client, sso, "kim"), errors.GROUPS_NOT_A_LIST)
    assert not User.objects.filter(username="kim").exists()
    assert not Membership.objects.filter(role=Role.ADMIN, user__username="kim").exists()


def test_an_unreachable_provider_is_said_so(sso, settings, client):
    apps = settings.SOCIALACCOUNT_PROVIDERS["openid_connect"]["APPS"]
    apps[0]["settings"] = {
        **apps[0]["settings"],
        "server_url": "http://127.0.0.1:9",
        "issuer": "http://127.0.0.1:9",
    }
    answer = client.post("/accounts/oidc/oidc/login/")
    assert_refused(answer, errors.UNREACHABLE)


def test_an_address_the_provider_does_not_vouch_for_is_kept_unverified(sso, client):
    kim(sso, email_verified=False)
    assert sign_in(client, sso, "kim")["Location"] == SIGNED_IN
    person = signed_in_user(client)
    assert not EmailAddress.objects.get(user=person).verified


def test_a_mapping_changed_in_the_admin_is_audited(sso, client):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    answer = client.post(
        reverse("admin:portal_grouprole_add"),
        {"provider": "", "group": "acme-viewers", "role": "tenant:acme:viewer"},
    )
    assert answer.status_code == 302
    entry = AuditEntry.objects.get(action="access.group_role")
    assert "acme-viewers" in entry.summary and entry.actor == root
    refused = client.post(
        reverse("admin:portal_grouprole_add"), {"provider": "", "group": "x", "role": "tenant:acme:owner"}
    )
    assert refused.status_code == 200
    assert not GroupRole.objects.filter(group="x").exists()
