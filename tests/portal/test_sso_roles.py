"""Single sign-on without a provider: the configuration, groups to roles, and local passwords turned off."""

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.urls import reverse

from portal.errors import Conflict
from portal.models import STAFF, AuditEntry, GroupRole, Membership, ProviderGrant, Role
from portal.services import remove_member, set_member_role
from portal.sso.config import ProviderConfigError, provider_apps, provider_origins
from portal.sso.roles import apply_provider_roles
from tests.factories import UserFactory
from tests.factories.tenancy import PASSWORD

# --- configuration ------------------------------------------------------------------------------------


def test_one_provider_from_the_three_variables():
    apps = provider_apps(
        {
            "OIDC_ISSUER": "https://id.example.com/realms/gpu/",
            "OIDC_CLIENT_ID": "portal",
            "OIDC_CLIENT_SECRET": "s",
        }
    )
    assert [app["provider_id"] for app in apps] == ["oidc"]
    assert apps[0]["settings"]["issuer"] == "https://id.example.com/realms/gpu"
    assert apps[0]["settings"]["scope"] == ["openid", "profile", "email"]
    assert apps[0]["settings"]["groups_claim"] == "groups"


def test_more_providers_from_json_each_with_its_options():
    apps = provider_apps(
        {
            "OIDC_ISSUER": "https://a.example.com",
            "OIDC_CLIENT_ID": "a",
            "OIDC_CLIENT_SECRET": "s",
            "OIDC_PROVIDERS": '[{"id": "entra", "name": "Entra ID", "issuer": "https://login.example.com/t/v2.0",'
            ' "client_id": "b", "client_secret": "t", "groups_claim": "roles", "mfa_acr": ["gold"],'
            ' "scopes": "profile email"}]',
        }
    )
    entra = apps[1]
    assert (entra["provider_id"], entra["name"]) == ("entra", "Entra ID")
    assert entra["settings"]["groups_claim"] == "roles"
    assert entra["settings"]["mfa_acr"] == ["gold"]
    assert entra["settings"]["scope"] == ["openid", "profile", "email"]


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"OIDC_ISSUER": "https://a.example.com", "OIDC_CLIENT_ID": "a"}, "client_secret"),
        ({"OIDC_ISSUER": "ftp://a.example.com", "OIDC_CLIENT_ID": "a", "OIDC_CLIENT_SECRET": "s"}, "http(s)"),
        ({"OIDC_PROVIDERS": "{not json"}, "not JSON"),
        ({"OIDC_PROVIDERS": '{"id": "x"}'}, "JSON list"),
        (
            {
                "OIDC_PROVIDERS": '[{"id": "Bad Id", "issuer": "https://x", "client_id": "a", '
                '"client_secret": "s"}]'
            },
            "lower-case",
        ),
        (
            {
                "OIDC_ISSUER": "https://a.example.com",
                "OIDC_CLIENT_ID": "a",
                "OIDC_CLIENT_SECRET": "s",
                "OIDC_PROVIDERS": '[{"id": "oidc", "issuer": "https://b", "client_id": "b", '
                '"client_secret": "t"}]',
            },
            "same id",
        ),
    ],
)
def test_a_provider_that_cannot_be_used_is_named_at_start(environ, words):
    with pytest.raises(ProviderConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        provider_apps(environ)


def test_no_provider_configured_is_no_provider():
    assert provider_apps({}) == []


# --- groups to roles ----------------------------------------------------------------------------------


def _map(group: str, role: str, provider: str = "") -> None:
    GroupRole.objects.create(group=group, role=role, provider=provider)


@pytest.fixture
def person(db):
    return UserFactory(username="sso-person")


def test_groups_give_tenant_roles_the_highest_per_tenant(tenancy, person):
    _map("acme-users", "tenant:acme:member")
    _map("acme-admins", "tenant:acme:admin")
    _map("globex-readers", "tenant:globex:viewer")
    changes = apply_provider_roles(
        user=person, provider="oidc", groups=["acme-users", "acme-admins", "globex-readers"]
    )
    assert changes == 2
    roles = dict(Membership.objects.filter(user=person).values_list("tenant__slug", "role"))
    assert roles == {"acme": Role.ADMIN, "globex": Role.VIEWER}
    assert set(Membership.objects.filter(user=person).values_list("hand_role", flat=True)) == {""}
    given = AuditEntry.objects.filter(action="access.provider_role_given")
    assert given.count() == 2 and {e.tenant_id for e in given} == {tenancy.acme.pk, tenancy.globex.pk}


def test_a_group_gone_takes_its_role_away_at_the_next_sign_in(tenancy, person):
    _map("acme-users", "tenant:acme:member")
    apply_provider_roles(user=person, provider="oidc", groups=["acme-users"])
    assert apply_provider_roles(user=person, provider="oidc", groups=["acme-users"]) == 0
    assert apply_provider_roles(user=person, provider="oidc", groups=[]) == 1
    assert not Membership.objects.filter(user=person).exists()
    assert AuditEntry.objects.filter(action="access.provider_role_taken", tenant_id=tenancy.acme.pk).exists()


def test_a_role_given_by_hand_is_kept_apart_and_never_taken_by_a_sign_in(tenancy):
    alice = tenancy.acme_member  # a member of acme by hand
    _map("acme-admins", "tenant:acme:admin")
    apply_provider_roles(user=alice, provider="oidc", groups=["acme-admins"])
    membership = Membership.objects.get(user=alice, tenant=tenancy.acme)
    assert (membership.role, membership.hand_role, membership.provider_role) == ("admin", "member", "admin")
    apply_provider_roles(user=alice, provider="oidc", groups=[])
    membership.refresh_from_db()
    assert (membership.role, membership.hand_role, membership.provider_role) == ("member", "member", "")


def test_a_mapping_of_another_provider_gives_nothing(tenancy, person):
    _map("acme-users", "tenant:acme:member", provider="entra")
    assert apply_provider_roles(user=person, provider="oidc", groups=["acme-users"]) == 0
    assert apply_provider_roles(user=person, provider="entra", groups=["acme-users"]) == 1


def test_a_platform_group_makes_staff_and_leaves_with_the_group(db, person):
    _map("gpu-approvers", "approver")
    apply_provider_roles(user=person, provider="oidc", groups=["gpu-approvers"])
    person.refresh_from_db()
    assert person.is_staff and person.groups.filter(name="approver").exists()
    assert set(ProviderGrant.objects.filter(user=person).values_list("grant", flat=True)) == {
        "approver",
        STAFF,
    }
    apply_provider_roles(user=person, provider="oidc", groups=[])
    person.refresh_from_db()
    assert not person.is_staff and not person.groups.exists()
    assert not ProviderGrant.objects.filter(user=person).exists()


def test_a_platform_group_held_by_hand_stays_when_the_provider_stops_giving_it(db):
    finance = UserFactory(username="fin", is_staff=True)
    finance.groups.add(Group.objects.get(name="finance"))
    _map("gpu-finance", "platform:finance")
    apply_provider_roles(user=finance, provider="oidc", groups=["gpu-finance"])
    apply_provider_roles(user=finance, provider="oidc", groups=[])
    finance.refresh_from_db()
    assert finance.is_staff and finance.groups.filter(name="finance").exists()


def test_a_mapping_must_name_a_role_and_a_tenant_that_exist(tenancy):
    with pytest.raises(ValidationError, match="tenant:<short name>"):
        GroupRole(group="g", role="tenant:acme:owner").clean()
    with pytest.raises(ValidationError, match="nosuch"):
        GroupRole(group="g", role="tenant:nosuch:member").clean()
    GroupRole(group="g", role="tenant:acme:viewer").clean()
    GroupRole(group="g", role="operator").clean()


# --- roles given by hand beside the provider's ------------------------------------------------------------


def test_an_admin_sets_the_hand_role_and_the_higher_holds(tenancy, person):
    _map("acme-admins", "tenant:acme:admin")
    apply_provider_roles(user=person, provider="oidc", groups=["acme-admins"])
    membership = Membership.objects.get(user=person, tenant=tenancy.acme)
    set_member_role(membership=membership, actor=tenancy.acme_admin, role=Role.VIEWER)
    membership.refresh_from_db()
    assert (membership.role, membership.hand_role, membership.provider_role) == ("admin", "viewer", "admin")
    apply_provider_roles(user=person, provider="oidc", groups=[])
    membership.refresh_from_db()
    assert (membership.role, membership.hand_role, membership.provider_role) == ("viewer", "viewer", "")


def test_a_member_through_the_provider_is_not_removed_by_hand(tenancy, person):
    _map("acme-users", "tenant:acme:member")
    apply_provider_roles(user=person, provider="oidc", groups=["acme-users"])
    membership = Membership.objects.get(user=person, tenant=tenancy.acme)
    with pytest.raises(Conflict, match="identity provider"):
        remove_member(membership=membership, actor=tenancy.acme_admin)
    assert Membership.objects.filter(pk=membership.pk).exists()


def test_the_tenant_page_says_which_roles_come_from_the_provider(tenancy, person, client_for):
    _map("acme-users", "tenant:acme:member")
    apply_provider_roles(user=person, provider="oidc", groups=["acme-users"])
    page = client_for(tenancy.acme_admin).get(reverse("tenant", kwargs={"slug": "acme"}))
    assert "Member from the identity provider" in page.content.decode()


# --- local passwords turned off ---------------------------------------------------------------------------


def test_without_local_passwords_only_superusers_sign_in_with_one(tenancy, settings, client):
    settings.LOCAL_PASSWORDS = False
    response = client.post(reverse("account_login"), {"login": "alice", "password": PASSWORD})
    assert response.status_code == 200
    assert "Passwords are turned off here" in response.content.decode()
    assert "_auth_user_id" not in client.session
    UserFactory(username="root", is_superuser=True, is_staff=True, password=PASSWORD)
    response = client.post(reverse("account_login"), {"login": "root", "password": PASSWORD})
    # The password is taken: on to the superuser's second factor.
    assert response.status_code == 302
    assert response["Location"] == reverse("mfa_authenticate")


def test_without_local_passwords_the_token_api_refuses_a_password(tenancy, settings, api_client):
    settings.LOCAL_PASSWORDS = False
    response = api_client.post(
        "/api/v1/auth/token/", {"username": "alice", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 403
    assert "identity provider" in response.json()["detail"]


def test_the_providers_origins_are_form_targets():
    apps = provider_apps(
        {
            "OIDC_ISSUER": "https://id.example.com/realms/gpu",
            "OIDC_CLIENT_ID": "a",
            "OIDC_CLIENT_SECRET": "s",
            "OIDC_PROVIDERS": '[{"id": "entra", "issuer": "https://login.example.net/tenant/v2.0", '
            '"client_id": "b", "client_secret": "t"}]',
        }
    )
    assert provider_origins(apps) == ["https://id.example.com", "https://login.example.net"]


def test_the_only_admin_may_give_up_the_hand_role_while_the_provider_keeps_them_admin(tenancy):
    bob = tenancy.acme_admin  # acme's only admin, by hand
    _map("acme-admins", "tenant:acme:admin")
    apply_provider_roles(user=bob, provider="oidc", groups=["acme-admins"])
    membership = Membership.objects.get(user=bob, tenant=tenancy.acme)
    set_member_role(membership=membership, actor=bob, role=Role.MEMBER)
    membership.refresh_from_db()
    assert (membership.role, membership.hand_role) == ("admin", "member")
    apply_provider_roles(user=bob, provider="oidc", groups=[])
    membership.refresh_from_db()
    assert membership.role == Role.MEMBER


def test_the_admin_edits_the_role_given_by_hand(tenancy, person, client):
    _map("acme-admins", "tenant:acme:admin")
    apply_provider_roles(user=person, provider="oidc", groups=["acme-admins"])
    membership = Membership.objects.get(user=person, tenant=tenancy.acme)
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    change = reverse("admin:portal_membership_change", args=[membership.pk])
    form = {"user": person.pk, "tenant": tenancy.acme.pk}
    # Saved as it is, with no role by hand: the provider's admin is no role given by hand.
    assert client.post(change, {**form, "hand_role": ""}).status_code == 302
    membership.refresh_from_db()
    assert (membership.role, membership.hand_role, membership.provider_role) == ("admin", "", "admin")
    assert client.post(change, {**form, "hand_role": "viewer"}).status_code == 302
    membership.refresh_from_db()
    assert (membership.role, membership.hand_role) == ("admin", "viewer")
    # Without a role from the provider, a membership needs one by hand.
    alice = Membership.objects.get(user=tenancy.acme_member, tenant=tenancy.acme)
    answer = client.post(
        reverse("admin:portal_membership_change", args=[alice.pk]),
        {"user": alice.user_id, "tenant": tenancy.acme.pk, "hand_role": ""},
    )
    assert answer.status_code == 200 and "Choose a role" in answer.content.decode()
    alice.refresh_from_db()
    assert alice.role == Role.MEMBER
