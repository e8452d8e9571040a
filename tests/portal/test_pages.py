"""Tenant pages: sign-in, what each person sees, bad input, languages and query counts."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.models import Project
from tests.factories import PASSWORD, MembershipFactory, ProjectFactory, TenantFactory, UserFactory


def test_anonymous_visitors_are_sent_to_sign_in(db, client):
    response = client.get("/")
    assert response.status_code == 302
    assert response.url.startswith(reverse("account_login"))


@pytest.mark.parametrize("login", ["alice", "alice@example.com"])
def test_sign_in_by_username_or_email_shows_own_tenant(login, tenancy, client):
    response = client.post(reverse("account_login"), {"login": login, "password": PASSWORD}, follow=True)
    body = response.content.decode()
    assert response.status_code == 200
    assert "Acme" in body and "Globex" not in body
    assert tenancy.vision.namespace in body and tenancy.recsys.namespace not in body


def test_wrong_password_is_refused_clearly(tenancy, client):
    response = client.post(reverse("account_login"), {"login": "alice", "password": "wrong"})
    assert response.status_code == 200  # allauth re-renders the form with the error
    assert "not correct" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_password_reset_sends_a_link(tenancy, client, mailoutbox):
    response = client.post(reverse("account_reset_password"), {"email": "alice@example.com"})
    assert response.status_code == 302
    assert len(mailoutbox) == 1 and "/accounts/password/reset/key/" in mailoutbox[0].body


def test_two_factor_setup_is_offered(tenancy, client):
    client.post(reverse("account_login"), {"login": "alice", "password": PASSWORD})
    activate = reverse("mfa_activate_totp")
    confirm = client.post(reverse("account_reauthenticate") + f"?next={activate}", {"password": PASSWORD})
    assert confirm.url == activate  # turning 2FA on asks for the password once more
    response = client.get(activate)
    assert response.status_code == 200
    assert "authenticator" in response.content.decode().lower()
    assert response.context["form"].secret  # the key the authenticator app is set up with


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        ({"name": "x" * 101, "slug": "ok"}, 400, "at most 100 characters"),
        ({"name": "Ok", "slug": "Not A Slug"}, 400, "lower-case letters"),
        ({"name": "Ok", "slug": "ok", "namespace": "kube-public"}, 400, "reserved"),
        ({"name": "Dup", "slug": "vision"}, 409, "already has a project"),
    ],
)
def test_bad_project_forms_are_refused(data, status, message, tenancy, client_for):
    before = Project.objects.count()
    response = client_for(tenancy.acme_admin).post(reverse("project-create", kwargs={"slug": "acme"}), data)
    assert response.status_code == status
    assert message in response.content.decode()
    assert Project.objects.count() == before


def test_unknown_slugs_are_404(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    assert client.get("/t/nope/").status_code == 404
    assert client.get("/t/acme/p/nope/").status_code == 404
    assert client.get("/t/globex/p/recsys/").status_code == 404


def test_get_on_a_post_only_page_is_405(tenancy, client_for):
    assert client_for(tenancy.acme_admin).get("/t/acme/projects/new/").status_code == 405


def test_korean_follows_the_browser(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    body = client.get("/", headers={"accept-language": "ko"}).content.decode()
    assert 'lang="ko"' in body
    assert "내 테넌트" in body


def test_language_can_be_switched(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    response = client.post(reverse("set_language"), {"language": "ko", "next": "/"})
    assert response.status_code == 302
    assert "내 테넌트" in client.get("/").content.decode()
    client.post(reverse("set_language"), {"language": "en", "next": "/"})
    assert "My tenants" in client.get("/", headers={"accept-language": "ko"}).content.decode()


def test_static_files_are_served_by_the_app(tenancy, client_for, settings):
    settings.WHITENOISE_AUTOREFRESH = False  # as in production: every file found once, as the app starts
    body = client_for(tenancy.acme_member).get("/").content.decode()
    css = body.split('<link rel="stylesheet" href="', 1)[1].split('"', 1)[0]
    assert css.startswith("/static/portal/portal.")  # hashed by the manifest
    response = client_for(tenancy.acme_member).get(css)
    assert response.status_code == 200
    assert b"--accent" in b"".join(response.streaming_content)
    assert "//" not in css


def _queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx)


def _grow(user, tenant, n):
    for _ in range(n):
        ProjectFactory(tenant=tenant)
        MembershipFactory(tenant=tenant)
    for _ in range(n // 3):
        other = TenantFactory()
        MembershipFactory(user=user, tenant=other)
        ProjectFactory(tenant=other)


@pytest.mark.parametrize(
    "page", ["home", "tenant", "admin:portal_project_changelist", "admin:portal_tenant_changelist"]
)
def test_page_queries_do_not_grow_with_rows(page, db, client):
    user = UserFactory(is_superuser=True, is_staff=True)
    tenant = TenantFactory(slug="big")
    MembershipFactory(user=user, tenant=tenant, role="admin")
    url = reverse(page, kwargs={"slug": "big"}) if page == "tenant" else reverse(page)
    client.force_login(user)
    _grow(user, tenant, 3)
    few = _queries(client, url)
    _grow(user, tenant, 30)
    assert _queries(client, url) == few


def test_admin_pages_of_every_model_render(tenancy, client):
    admin = UserFactory(is_superuser=True, is_staff=True)
    client.force_login(admin)
    for model in ("tenant", "project", "membership", "invitation"):
        assert client.get(reverse(f"admin:portal_{model}_changelist") + "?q=acme").status_code == 200
        assert client.get(reverse(f"admin:portal_{model}_add")).status_code == 200
    assert client.get(reverse("admin:portal_tenant_change", args=[tenancy.acme.pk])).status_code == 200
