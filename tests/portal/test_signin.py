"""Signing in: the admin goes through the portal's sign-in, staff need two-factor, and failed
attempts lock an account out wherever they are tried — the form, the admin or the token API."""

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.urls import reverse

from portal.models import ApiToken
from tests.factories import PASSWORD, UserFactory, enable_totp, totp_code

TOKEN_URL = "/api/v1/auth/token/"


@pytest.fixture
def approver(db):
    user = UserFactory(username="carol", is_staff=True, totp=False)
    user.groups.add(Group.objects.get(name="approver"))
    return user


def sign_in(client, login, password=PASSWORD, next_url="/admin/"):
    return client.post(reverse("account_login") + f"?next={next_url}", {"login": login, "password": password})


def test_admin_login_with_a_password_alone_does_not_let_a_totp_user_in(approver, client):
    secret = enable_totp(approver)
    posted = client.post("/admin/login/?next=/admin/", {"username": "carol", "password": PASSWORD})
    assert posted.status_code == 302 and posted.url.startswith(reverse("account_login"))
    assert client.get("/admin/").status_code == 302  # still signed out
    assert client.get("/api/v1/capacity/summary/").status_code == 401

    stage = sign_in(client, "carol")
    assert stage.status_code == 302 and stage.url == reverse("mfa_authenticate")
    assert client.get("/admin/").status_code == 302  # the password alone is not a session

    done = client.post(reverse("mfa_authenticate"), {"code": totp_code(secret)})
    assert done.status_code == 302 and done.url == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_the_admin_login_page_sends_people_to_the_portal_sign_in(client, db):
    response = client.get("/admin/login/?next=/admin/pools/")
    assert response.status_code == 302
    assert response.url.startswith(reverse("account_login"))
    assert "next=%2Fadmin%2Fpools%2F" in response.url


def test_twelve_wrong_passwords_lock_the_account_even_for_the_right_one(tenancy, client):
    for _ in range(12):
        assert sign_in(client, "bob", "wrong-password").status_code == 200
    locked = sign_in(client, "bob")
    assert locked.status_code == 200
    assert "Too many failed login attempts" in locked.content.decode()
    assert "_auth_user_id" not in client.session


def test_switching_between_user_name_and_e_mail_does_not_reset_the_count(tenancy, client):
    for login in ["bob", "bob@example.com", "BOB", "Bob@Example.com", "bob"]:
        sign_in(client, login, "wrong-password")
    assert "Too many failed login attempts" in sign_in(client, "bob@example.com").content.decode()


def test_staff_without_two_factor_reach_nothing_until_they_turn_it_on(approver, client, settings):
    settings.STAFF_REQUIRE_TOTP = True
    signed_in = sign_in(client, "carol")
    assert client.get(signed_in.url).url == reverse("mfa_activate_totp")
    for url in ["/", "/admin/", "/capacity/", "/accounts/tokens/"]:
        response = client.get(url)
        assert (response.status_code, response.url) == (302, reverse("mfa_activate_totp")), url
    api = client.get("/api/v1/pool-requests/")
    assert api.status_code == 403 and "two-factor" in api.json()["detail"]
    assert client.get(reverse("mfa_index")).status_code == 200
    confirm = client.get(reverse("mfa_activate_totp"))  # allauth asks for the password again first
    assert confirm.url.startswith(reverse("account_reauthenticate"))
    assert client.get(confirm.url).status_code == 200
    assert client.post(confirm.url, {"password": PASSWORD}).status_code == 302
    assert client.get(reverse("mfa_activate_totp")).status_code == 200

    enable_totp(approver)
    assert client.get("/admin/").status_code == 200


def test_the_requirement_can_be_turned_off_and_spares_tenants(approver, tenancy, client, settings):
    settings.STAFF_REQUIRE_TOTP = True
    client.force_login(tenancy.acme_member)  # tenants choose for themselves
    assert client.get("/").status_code == 200
    settings.STAFF_REQUIRE_TOTP = False
    client.force_login(approver)
    assert client.get("/admin/").status_code == 200


def test_staff_without_two_factor_get_no_token(approver, api_client, settings):
    settings.STAFF_REQUIRE_TOTP = True
    response = api_client.post(TOKEN_URL, {"username": "carol", "password": PASSWORD}, format="json")
    assert response.status_code == 403
    assert "two-factor" in response.json()["detail"]
    assert not ApiToken.objects.exists()


def test_rotating_x_forwarded_for_does_not_lift_the_limit(tenancy, api_client):
    answers = []
    for attempt in range(40):
        response = api_client.post(
            TOKEN_URL,
            {"username": "bob", "password": f"guess-{attempt}"},
            format="json",
            headers={"x-forwarded-for": f"203.0.113.{attempt}"},
        )
        answers.append(response.status_code)
    assert set(answers[:5]) == {400}  # wrong passwords, said as such
    assert set(answers[10:]) == {429}  # then nothing more is even checked
    right = api_client.post(
        TOKEN_URL,
        {"username": "bob", "password": PASSWORD},
        format="json",
        headers={"x-forwarded-for": "198.51.100.7"},
    )
    assert right.status_code == 429
    assert not ApiToken.objects.exists()


def test_many_accounts_from_one_address_hit_the_address_limit(tenancy, api_client):
    UserFactory.create_batch(35)
    answers = [
        api_client.post(TOKEN_URL, {"username": f"user-{n}", "password": "x"}, format="json").status_code
        for n in range(35)
    ]
    assert 429 in answers and answers[0] == 400


def test_the_forwarded_address_counts_only_behind_trusted_proxies(tenancy, api_client, settings):
    """With one trusted proxy, the address it appended is the client; different clients differ."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 1
    UserFactory.create_batch(35)
    for n in range(35):
        response = api_client.post(
            TOKEN_URL,
            {"username": f"user-{n}", "password": "x"},
            format="json",
            headers={"x-forwarded-for": f"spoofed, 192.0.2.{n}"},
        )
        assert response.status_code == 400, n  # each its own client: no address limit reached


def test_a_lock_out_from_the_form_holds_at_the_token_endpoint(tenancy, client, api_client):
    for _ in range(5):
        sign_in(client, "bob", "wrong-password")
    response = api_client.post(TOKEN_URL, {"username": "bob", "password": PASSWORD}, format="json")
    assert response.status_code == 429
    assert "Too many failed login attempts" in response.json()["detail"]
    assert not ApiToken.objects.exists()


def test_a_lock_out_from_the_token_endpoint_holds_at_the_form(tenancy, client, api_client):
    for _ in range(5):
        api_client.post(TOKEN_URL, {"username": "bob@example.com", "password": "nope"}, format="json")
    assert "Too many failed login attempts" in sign_in(client, "bob").content.decode()


def test_wrong_two_factor_codes_count_as_failed_attempts(tenancy, api_client):
    secret = enable_totp(tenancy.acme_member)
    body = {"username": "alice", "password": PASSWORD}
    for _ in range(5):
        wrong = api_client.post(TOKEN_URL, {**body, "code": "000000"}, format="json")
        assert wrong.status_code in (400, 429)
    right = api_client.post(TOKEN_URL, {**body, "code": totp_code(secret)}, format="json")
    assert right.status_code == 429
    assert not ApiToken.objects.exists()


def test_wrong_codes_at_the_form_and_the_token_endpoint_count_against_one_limit(tenancy, client, api_client):
    """Alternating between the two doors gives no more guesses than either alone: LOGIN_FAILURES_LIMIT in
    all. The token endpoint is called from another address, so that only the account's count can stop it."""
    secret = enable_totp(tenancy.acme_member)
    body = {"username": "alice", "password": PASSWORD}

    def by_api(code):
        return api_client.post(TOKEN_URL, {**body, "code": code}, format="json", REMOTE_ADDR="192.0.2.9")

    assert sign_in(client, "alice").url == reverse("mfa_authenticate")
    for guess in range(django_settings.LOGIN_FAILURES_LIMIT):
        if guess % 2 == 0:
            wrong = client.post(reverse("mfa_authenticate"), {"code": "000000"})
            assert wrong.status_code == 200 and "Incorrect code" in wrong.content.decode(), guess
        else:
            assert by_api("000000").status_code == 400, guess

    right = client.post(reverse("mfa_authenticate"), {"code": totp_code(secret)})
    assert "Too many failed login attempts" in right.content.decode()
    assert "_auth_user_id" not in client.session
    refused = by_api(totp_code(secret))
    assert refused.status_code == 429 and "Too many failed login attempts" in refused.json()["detail"]
    assert not ApiToken.objects.exists()


def test_a_right_code_is_not_counted(tenancy, client, api_client):
    secret = enable_totp(tenancy.acme_member)
    body = {"username": "alice", "password": PASSWORD}
    for _ in range(django_settings.LOGIN_FAILURES_LIMIT - 1):
        assert api_client.post(TOKEN_URL, {**body, "code": "000000"}, format="json").status_code == 400
    right = api_client.post(TOKEN_URL, {**body, "code": totp_code(secret, periods_ago=1)}, format="json")
    assert right.status_code == 200  # the last guess left, given back
    assert sign_in(client, "alice").url == reverse("mfa_authenticate")
    done = client.post(reverse("mfa_authenticate"), {"code": totp_code(secret)})
    assert done.status_code == 302 and "_auth_user_id" in client.session
