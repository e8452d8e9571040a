"""The tenancy API: tokens, projects, bad input and constant query counts."""

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import TOTP, format_hotp_value, generate_totp_secret, hotp_value
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.models import ApiToken, Project, Tenant
from tests.factories import PASSWORD, MembershipFactory, ProjectFactory, TenantFactory, UserFactory


def test_token_by_username_or_email_then_use_it(tenancy, api_client):
    for login in ("alice", "alice@example.com", "ALICE@example.com"):
        response = api_client.post(
            "/api/v1/auth/token/", {"username": login, "password": PASSWORD}, format="json"
        )
        assert response.status_code == 200, response.content
    token = response.json()["token"]
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert [p["slug"] for p in api_client.get("/api/v1/projects/").json()["results"]] == ["vision"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"username": "alice", "password": "wrong"}, "non_field_errors"),
        ({"username": "nobody", "password": PASSWORD}, "non_field_errors"),
        ({"username": "alice"}, "password"),
        ({"username": "a" * 300, "password": "x"}, "username"),
    ],
)
def test_bad_credentials_get_400_and_no_token(body, field, tenancy, api_client):
    response = api_client.post("/api/v1/auth/token/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not ApiToken.objects.exists()


def test_two_factor_users_must_send_a_code(tenancy, api_client):
    secret = generate_totp_secret()
    TOTP.activate(tenancy.acme_member, secret)
    body = {"username": "alice", "password": PASSWORD}
    without = api_client.post("/api/v1/auth/token/", body, format="json")
    assert without.status_code == 400 and "code" in without.json()
    wrong = api_client.post("/api/v1/auth/token/", {**body, "code": "000000"}, format="json")
    assert wrong.status_code == 400
    import time

    from allauth.mfa import app_settings

    code = format_hotp_value(hotp_value(secret, int(time.time()) // app_settings.TOTP_PERIOD))
    right = api_client.post("/api/v1/auth/token/", {**body, "code": code}, format="json")
    assert right.status_code == 200
    assert Authenticator.objects.filter(user=tenancy.acme_member).exists()


def test_malformed_json_is_a_400_in_json(tenancy, api_for):
    response = api_for(tenancy.acme_admin).post(
        "/api/v1/projects/", data="{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_anonymous_api_calls_get_401(db, api_client):
    response = api_client.get("/api/v1/projects/")
    assert response.status_code == 401
    assert "detail" in response.json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tenant": "acme", "slug": "x" * 31, "name": "Long"}, "slug"),
        ({"tenant": "acme", "slug": "ok", "name": "n" * 101}, "name"),
        # A project's name goes into e-mail subjects: a line break there would stop the e-mail.
        ({"tenant": "acme", "slug": "ok", "name": "Vision\nBcc: all@example.com"}, "name"),
        ({"tenant": "acme", "slug": "ok", "name": "Vision\x7f"}, "name"),
        ({"tenant": "acme", "slug": "Bad_Slug", "name": "Bad"}, "slug"),
        ({"tenant": "acme", "slug": "ok", "name": "Ok", "namespace": "kube-system"}, None),
        ({"tenant": "acme", "slug": "ok", "name": "Ok", "namespace": "-bad"}, "namespace"),
        ({"tenant": "nope", "slug": "ok", "name": "Ok"}, "tenant"),
        ({"tenant": "globex", "slug": "ok", "name": "Ok"}, "tenant"),
        ({"slug": "ok", "name": "Ok"}, "tenant"),
        ([1, 2], "non_field_errors"),
    ],
)
def test_bad_projects_are_refused(body, field, tenancy, api_for):
    before = Project.objects.count()
    response = api_for(tenancy.acme_admin).post("/api/v1/projects/", body, format="json")
    assert response.status_code == 400, response.content
    assert (field in response.json()) if field else ("reserved" in response.json()["detail"])
    assert Project.objects.count() == before


def test_duplicate_project_slug_or_namespace_is_a_conflict(tenancy, api_for):
    client = api_for(tenancy.acme_admin)
    same_slug = client.post(
        "/api/v1/projects/", {"tenant": "acme", "slug": "vision", "name": "V"}, format="json"
    )
    taken_ns = client.post(
        "/api/v1/projects/",
        {"tenant": "acme", "slug": "other", "name": "O", "namespace": tenancy.vision.namespace},
        format="json",
    )
    assert (same_slug.status_code, taken_ns.status_code) == (409, 409)
    assert "already" in same_slug.json()["detail"]
    assert "already taken" in taken_ns.json()["detail"]
    assert tenancy.acme.projects.count() == 1


def test_project_namespace_defaults_to_tenant_and_slug(tenancy, api_for):
    response = api_for(tenancy.acme_admin).post(
        "/api/v1/projects/", {"tenant": "acme", "slug": "speech", "name": "Speech"}, format="json"
    )
    assert response.status_code == 201
    assert response.json()["namespace"] == "acme-speech"
    assert set(response.json()) >= {"id", "slug", "name", "tenant", "namespace"}


def test_project_lists_are_paged(tenancy, api_for, settings):
    ProjectFactory.create_batch(3, tenant=tenancy.acme)
    client = api_for(tenancy.acme_member)
    first = client.get("/api/v1/projects/").json()
    assert (first["count"], len(first["results"]), first["next"], first["previous"]) == (4, 4, None, None)
    page = client.get("/api/v1/projects/?limit=2&offset=1").json()
    assert page["count"] == 4 and len(page["results"]) == 2
    assert "limit=2" in page["next"] and page["previous"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "PAGE_SIZE": 50}
    ProjectFactory.create_batch(60, tenant=tenancy.acme)
    default = client.get("/api/v1/projects/").json()
    assert (default["count"], len(default["results"])) == (64, 50)  # 50 unless asked


def _queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx)


@pytest.mark.parametrize("url", ["/api/v1/projects/", "/api/v1/tenants/"])
def test_list_queries_do_not_grow_with_rows(url, db, api_for):
    user = UserFactory()
    ProjectFactory(tenant=MembershipFactory(user=user, tenant=TenantFactory()).tenant)
    client = api_for(user)
    few = _queries(client, url)
    for _ in range(15):
        tenant = TenantFactory()
        MembershipFactory(user=user, tenant=tenant)
        ProjectFactory.create_batch(3, tenant=tenant)
    assert _queries(client, url) == few


def test_schema_and_docs_are_served_offline(db, client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/projects/" in schema.content
    docs = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in docs
    assert "cdn" not in docs.lower() and "https://" not in docs.split("<body")[0]


def test_the_openapi_schema_is_valid_and_has_no_warnings(tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert "/api/v1/pool-requests/{id}/approve/" in (tmp_path / "schema.yaml").read_text()


def test_a_tenant_name_is_one_line(db):
    with pytest.raises(ValidationError, match="control characters"):
        Tenant(name="Acme\r\nBcc: all@example.com", slug="acme").full_clean()
