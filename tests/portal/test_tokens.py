"""API tokens: a new key per sign-in, kept only as a digest, revoked by its owner, by staff, by a
password change or by turning two-factor on; listed and revoked on the account page."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from portal import tokens
from portal.models import ApiToken, TokenRevocation
from tests.factories import PASSWORD, UserFactory, totp_code

TOKEN_URL = "/api/v1/auth/token/"


def issue(api_client, login="alice", **extra):
    response = api_client.post(TOKEN_URL, {"username": login, "password": PASSWORD, **extra}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["token"]


def calls_with(api_client, key) -> int:
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    status = api_client.get("/api/v1/projects/").status_code
    api_client.credentials()
    return status


def test_each_sign_in_issues_a_new_key_kept_only_as_a_digest(tenancy, api_client):
    first, second = issue(api_client, name="laptop"), issue(api_client)
    assert first != second
    assert calls_with(api_client, first) == calls_with(api_client, second) == 200
    stored = ApiToken.objects.get(prefix=first[:8])
    assert stored.name == "laptop"
    assert first not in {stored.digest, stored.prefix, stored.credential_stamp}
    assert stored.last_used_at is not None


def test_delete_revokes_the_callers_token_and_a_new_one_can_be_had(tenancy, api_client):
    key, other = issue(api_client), issue(api_client)
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api_client.delete(TOKEN_URL).status_code == 204
    api_client.credentials()
    assert calls_with(api_client, key) == 401
    assert calls_with(api_client, other) == 200  # only the caller's token goes
    assert ApiToken.objects.get(prefix=key[:8]).revoked_reason == TokenRevocation.BY_OWNER
    assert calls_with(api_client, issue(api_client)) == 200


def test_delete_needs_a_token(tenancy, api_client):
    assert api_client.delete(TOKEN_URL).status_code == 401
    api_client.force_login(tenancy.acme_member)  # a browser session has no token to revoke
    assert api_client.delete(TOKEN_URL).status_code == 401


@pytest.mark.parametrize("header", ["Token", "Token a b", "Token not-a-key", "Token \u00e9t\u00e9"])
def test_bad_token_headers_are_401(header, tenancy, api_client):
    api_client.credentials(HTTP_AUTHORIZATION=header.encode().decode("latin-1"))
    response = api_client.get("/api/v1/projects/")
    assert response.status_code == 401
    assert response.json()["detail"]


def test_a_password_change_ends_every_token(tenancy, api_client, client):
    key = issue(api_client)
    client.force_login(tenancy.acme_member)
    changed = client.post(
        reverse("account_change_password"),
        {"oldpassword": PASSWORD, "password1": "a-new-Pass-phrase-91", "password2": "a-new-Pass-phrase-91"},
    )
    assert changed.status_code == 302
    assert calls_with(api_client, key) == 401
    response = api_client.post(
        TOKEN_URL, {"username": "alice", "password": "a-new-Pass-phrase-91"}, format="json"
    )
    assert calls_with(api_client, response.json()["token"]) == 200


def test_a_password_set_anywhere_else_ends_them_too(tenancy, api_client):
    key = issue(api_client)
    tenancy.acme_member.set_password("set-by-an-admin-55")  # the admin's form, `changepassword`
    tenancy.acme_member.save()
    assert calls_with(api_client, key) == 401


def test_turning_two_factor_on_ends_every_token(
    tenancy, api_client, client, django_capture_on_commit_callbacks
):
    key = issue(api_client)
    client.force_login(tenancy.acme_member)
    client.post(reverse("account_reauthenticate"), {"password": PASSWORD})
    assert client.get(reverse("mfa_activate_totp")).status_code == 200
    secret = client.session["mfa.totp.secret"]
    with django_capture_on_commit_callbacks(execute=True):  # allauth signals after commit
        activated = client.post(reverse("mfa_activate_totp"), {"code": totp_code(secret)})
    assert activated.status_code == 302
    assert calls_with(api_client, key) == 401
    assert ApiToken.objects.get(prefix=key[:8]).revoked_reason == TokenRevocation.TWO_FACTOR
    fresh = issue(api_client, code=totp_code(secret))
    assert calls_with(api_client, fresh) == 200


def test_tokens_can_expire(tenancy, api_client, settings):
    settings.API_TOKEN_TTL_DAYS = 30
    response = api_client.post(TOKEN_URL, {"username": "alice", "password": PASSWORD}, format="json")
    expires = response.json()["expires_at"]
    assert expires is not None
    key = response.json()["token"]
    token = ApiToken.objects.get(prefix=key[:8])
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert calls_with(api_client, key) == 401


def test_issuing_past_the_cap_revokes_the_oldest(tenancy, api_client, settings):
    settings.API_TOKENS_PER_USER = 2
    oldest, middle, newest = issue(api_client), issue(api_client), issue(api_client)
    assert [calls_with(api_client, k) for k in (oldest, middle, newest)] == [401, 200, 200]
    assert ApiToken.objects.get(prefix=oldest[:8]).revoked_reason == TokenRevocation.REPLACED


def test_an_inactive_persons_tokens_stop(tenancy, api_client):
    key = issue(api_client)
    tenancy.acme_member.is_active = False
    tenancy.acme_member.save()
    assert calls_with(api_client, key) == 401


def test_the_account_page_makes_lists_and_revokes_tokens(tenancy, client_for, api_client):
    client = client_for(tenancy.acme_member)
    made = client.post(reverse("api-tokens"), {"name": "notebook"})
    assert made.status_code == 200
    key = made.context["issued"].key
    assert key in made.content.decode()  # shown this once
    assert "no-store" in made["Cache-Control"]
    assert calls_with(api_client, key) == 200

    listed = client.get(reverse("api-tokens")).content.decode()
    assert "notebook" in listed and key[:8] in listed and key not in listed

    token = ApiToken.objects.get(prefix=key[:8])
    assert client.post(reverse("api-token-revoke", kwargs={"pk": token.pk})).status_code == 302
    assert calls_with(api_client, key) == 401
    assert "revoked by its owner" in client.get(reverse("api-tokens")).content.decode()


def test_a_token_name_is_required_and_bounded(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    assert client.post(reverse("api-tokens"), {"name": ""}).status_code == 400
    assert client.post(reverse("api-tokens"), {"name": "x" * 101}).status_code == 400
    assert not ApiToken.objects.exists()


def test_nobody_revokes_another_persons_token(tenancy, client_for, api_client):
    key = issue(api_client, login="bob")
    token = ApiToken.objects.get(prefix=key[:8])
    client = client_for(tenancy.acme_member)
    assert client.post(reverse("api-token-revoke", kwargs={"pk": token.pk})).status_code == 404
    assert "bob" not in client.get(reverse("api-tokens")).content.decode()
    assert calls_with(api_client, key) == 200


def test_superusers_revoke_tokens_in_the_admin(tenancy, client_for, api_client):
    key = issue(api_client)
    token = ApiToken.objects.get(prefix=key[:8])
    admin = client_for(UserFactory(username="root", is_staff=True, is_superuser=True))
    changelist = admin.get(reverse("admin:portal_apitoken_changelist"))
    assert changelist.status_code == 200 and key[:8] in changelist.content.decode()
    assert key not in changelist.content.decode()
    response = admin.post(
        reverse("admin:portal_apitoken_changelist"),
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    assert response.status_code == 302
    assert calls_with(api_client, key) == 401
    assert ApiToken.objects.get(pk=token.pk).revoked_reason == TokenRevocation.BY_STAFF


def test_platform_groups_do_not_manage_tokens(tenancy, client_for):
    operator = UserFactory(username="erin", is_staff=True)
    operator.groups.add(Group.objects.get(name="operator"))
    assert client_for(operator).get(reverse("admin:portal_apitoken_changelist")).status_code == 403


def test_the_token_list_is_paged(tenancy, client_for, settings):
    settings.API_TOKENS_PER_USER = 100
    for n in range(25):
        tokens.issue_token(user=tenancy.acme_member, name=f"t{n:02}")
    client = client_for(tenancy.acme_member)
    first = client.get(reverse("api-tokens")).content.decode()
    assert "t24" in first and "t04" not in first and "?page=2" in first
    second = client.get(reverse("api-tokens") + "?page=2").content.decode()
    assert "t04" in second and "t24" not in second
