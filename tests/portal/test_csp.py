"""Browser hardening: every page answers a strict Content-Security-Policy and holds nothing it refuses."""

from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from django.contrib import admin
from django.contrib.staticfiles import storage  # not its lazy `staticfiles_storage`: see below
from django.urls import reverse
from django.utils import translation

from tests.factories import PASSWORD, ClusterFactory, InvitationFactory, UserFactory, enable_totp

POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
# What a page loads, by element and attribute; links to follow are no load and may go anywhere.
LOADS = {"script": "src", "link": "href", "img": "src", "iframe": "src", "form": "action", "source": "src"}
STATIC_FILES = [
    "portal/portal.css",
    "portal/portal.js",
    "portal/request-estimate.js",
    "portal/swagger-ui.css",
]


class PageParts(HTMLParser):
    """What a page holds that the policy refuses (inline code) or that comes from elsewhere."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.inline: list[str] = []
        self.foreign: list[str] = []
        self.scripts: list[str] = []
        self.confirms: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name, value in attrs:
            if name == "style" or name.startswith("on"):
                self.inline.append(f"<{tag} {name}={value!r}>")
            if (value or "").strip().lower().startswith("javascript:"):
                self.inline.append(f"<{tag} {name}={value!r}>")
        if tag == "style":
            self.inline.append("<style>")
        if tag == "script":
            if attributes.get("src"):
                self.scripts.append(attributes["src"])
            elif attributes.get("type") != "application/json":  # data, which no browser runs
                self.inline.append(f"<script {attributes}>")
        if "data-confirm" in attributes:
            self.confirms.append(attributes["data-confirm"])
        address = attributes.get(LOADS.get(tag, ""))
        if address and not _same_origin(address, data_allowed=tag == "img"):
            self.foreign.append(f"<{tag} {address}>")


def _same_origin(address: str, *, data_allowed: bool) -> bool:
    parts = urlsplit(address)
    if parts.scheme == "data":
        return data_allowed
    return not parts.scheme and not parts.netloc


def _policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    directives = [part.split() for part in header.split(";") if part.strip()]
    return {name: sources for name, *sources in directives}


def assert_hardened(response, status: int = 200) -> PageParts:
    """The page answers the portal's policy and holds no inline code and nothing from other hosts."""
    assert response.status_code == status, response
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]
    assert _policy(response) == POLICY
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    page = PageParts(response.content.decode())
    assert page.inline == [], f"{response.request['PATH_INFO']}: inline code the policy refuses"
    assert page.foreign == [], f"{response.request['PATH_INFO']}: loads from another host"
    return page


@pytest.fixture
def fleet(settings, db):
    from pools.services.inventory import sync_inventory

    settings.SIMULATED_MIG_APPLY_SECONDS = 0
    cluster = ClusterFactory(
        name="sim",
        fleet=[
            ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, {"3g.71gb": 2}] + [None] * 6),
            ("h100", 1, "H100-80GB", [None] * 8),
        ],
    )
    sync_inventory(cluster=cluster)
    return cluster


@pytest.fixture
def pool_and_request(fleet, tenancy, staff_user):
    """An active pool and a request still waiting for approval, both of Acme's vision project."""
    from pools.models import Pool
    from pools.services import admit_waiting, approve_request, provision_step, submit_request

    granted = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=granted.pk, approver=staff_user("approver"))
    admit_waiting()
    pool = Pool.objects.get()
    while provision_step(pool_id=pool.pk) != "done":
        pass
    waiting = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-1g.18gb", 1)]
    )
    return pool, waiting


def _login(client, username: str):
    """Signs in through allauth's forms and confirms the password, so that pages asking for a
    recent sign-in (two-factor setup) open."""
    response = client.post(reverse("account_login"), {"login": username, "password": PASSWORD})
    assert response.status_code == 302, response.content.decode()
    assert client.post(reverse("account_reauthenticate"), {"password": PASSWORD}).status_code == 302
    return client


@pytest.mark.parametrize(
    ("who", "name", "kwargs"),
    [
        ("acme_member", "home", {}),
        ("acme_member", "tenant", {"slug": "acme"}),
        ("acme_member", "project", {"tenant_slug": "acme", "slug": "vision"}),
        ("acme_member", "pool-request-new", {"tenant_slug": "acme", "slug": "vision"}),
        ("acme_member", "tenant-requests", {"tenant_slug": "acme"}),
        ("acme_member", "tenant-pools", {"tenant_slug": "acme"}),
        ("acme_member", "preferences", {}),
        ("acme_member", "swagger-ui", {}),
        ("acme_viewer", "tenant", {"slug": "acme"}),
        ("acme_admin", "tenant", {"slug": "acme"}),
        ("acme_admin", "project", {"tenant_slug": "acme", "slug": "vision"}),
        ("outsider", "home", {}),
    ],
)
def test_tenant_pages_are_hardened(who, name, kwargs, tenancy, client_for):
    assert_hardened(client_for(getattr(tenancy, who)).get(reverse(name, kwargs=kwargs)))


def test_a_foreign_tenant_answers_a_hardened_404(tenancy, client_for):
    assert_hardened(client_for(tenancy.acme_member).get(reverse("tenant", kwargs={"slug": "globex"})), 404)


def test_the_request_form_loads_its_estimate_from_a_file(fleet, tenancy, client_for):
    url = reverse("pool-request-new", kwargs={"tenant_slug": "acme", "slug": "vision"})
    page = assert_hardened(client_for(tenancy.acme_member).get(url))
    assert storage.staticfiles_storage.url("portal/request-estimate.js") in page.scripts
    assert storage.staticfiles_storage.url("portal/portal.js") in page.scripts


def test_request_and_pool_pages_confirm_through_data_attributes(pool_and_request, tenancy, client_for):
    pool, waiting = pool_and_request
    client = client_for(tenancy.acme_member)
    request_page = assert_hardened(
        client.get(reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": waiting.pk}))
    )
    pool_page = assert_hardened(client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})))
    assert request_page.confirms == ["Cancel this request?"]
    assert pool_page.confirms == ["Release this pool? Its GPUs go back to the fleet and billing stops."]


def test_the_member_removal_asks_in_the_reader_s_language(tenancy, client_for):
    client = client_for(tenancy.acme_admin)
    page = assert_hardened(client.get(reverse("tenant", kwargs={"slug": "acme"})))
    assert page.confirms and set(page.confirms) == {"Remove this member from the tenant?"}
    with translation.override("ko"):
        korean = translation.gettext("Remove this member from the tenant?")
    assert korean != "Remove this member from the tenant?"  # the catalogue still knows the string
    page = assert_hardened(client.get(reverse("tenant", kwargs={"slug": "acme"}), HTTP_ACCEPT_LANGUAGE="ko"))
    assert set(page.confirms) == {korean}


def test_the_capacity_pages_place_slices_with_classes(pool_and_request, staff_user, client_for):
    client = client_for(staff_user("operator"))
    assert_hardened(client.get(reverse("capacity-dashboard")))  # the overview: bars, no GPU drawn
    pool, _waiting = pool_and_request
    response = client.get(reverse("capacity-group", kwargs={"pk": pool.cluster_id, "group": "none"}))
    assert_hardened(response)
    node = pool.allocations.get().gpu.node
    assert_hardened(client.get(reverse("capacity-node", kwargs={"pk": node.pk})))
    body = response.content.decode()
    assert "at-5 span-4" in body  # the second 3g.71gb starts at memory slice 4 and spans 4
    assert "at-1 span-8" in body  # the whole H100 held by the pool


@pytest.mark.parametrize(
    "name",
    [
        "account_login",
        "account_signup",
        "account_reset_password",
        "account_reset_password_done",
        "admin:login",
    ],
)
def test_pages_for_visitors_are_hardened(name, db, client):
    assert_hardened(client.get(reverse(name), follow=True))


def test_the_invitation_page_is_hardened(tenancy, client):
    invitation = InvitationFactory(tenant=tenancy.acme)
    assert_hardened(client.get(reverse("invitation", kwargs={"token": invitation.token})))


@pytest.mark.parametrize(
    "name",
    [
        "account_email",
        "account_change_password",
        "account_reauthenticate",
        "account_logout",
        "mfa_index",
        "mfa_activate_totp",
    ],
)
def test_account_pages_are_hardened(name, tenancy, client):
    assert_hardened(_login(client, "alice").get(reverse(name)))


def test_two_factor_pages_are_hardened(tenancy, client):
    from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes

    _login(client, "alice")
    enable_totp(tenancy.acme_member)
    RecoveryCodes.activate(tenancy.acme_member)
    for name in [
        "mfa_index",
        "mfa_deactivate_totp",
        "mfa_view_recovery_codes",
        "mfa_generate_recovery_codes",
    ]:
        assert_hardened(client.get(reverse(name)))
    client.logout()
    second_step = client.post(reverse("account_login"), {"login": "alice", "password": PASSWORD})
    assert second_step.url == reverse("mfa_authenticate")
    assert_hardened(client.get(second_step.url))


def test_setting_a_new_password_from_the_mailed_link_is_hardened(tenancy, client, mailoutbox):
    client.post(reverse("account_reset_password"), {"email": "alice@example.com"})
    link = next(line for line in mailoutbox[0].body.splitlines() if "/accounts/password/reset/key/" in line)
    assert_hardened(client.get(urlsplit(link.strip()).path, follow=True))


@pytest.fixture
def superuser(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)  # with TOTP, as staff are


def test_the_admin_index_and_a_change_form_are_hardened(tenancy, superuser, client_for):
    client = client_for(superuser)
    assert_hardened(client.get(reverse("admin:index")))
    assert_hardened(client.get(reverse("admin:portal_tenant_change", args=[tenancy.acme.pk])))


def test_every_admin_changelist_is_hardened(pool_and_request, superuser, client_for):
    """Every model's list in turn, on one fleet with a pool and a request, built once."""
    client = client_for(superuser)
    models = sorted(admin.site._registry, key=lambda model: model._meta.label)
    assert len(models) >= 40  # every registered model, not a few
    for model in models:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = client.get(url)
        assert response.status_code == 200, url
        assert_hardened(response)


def test_the_api_documentation_runs_its_script_from_a_file(tenancy, client_for):
    client = client_for(tenancy.acme_member)
    page = assert_hardened(client.get(reverse("swagger-ui")))
    start_up = [src for src in page.scripts if "script" in urlsplit(src).query]
    assert len(start_up) == 1
    script = client.get(start_up[0])
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()


def test_a_browser_asking_the_api_for_html_gets_json(tenancy, api_for):
    client = api_for(tenancy.acme_member)
    browser = client.get("/api/v1/projects/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert browser.status_code == 200
    assert browser["Content-Type"] == "application/json"
    assert [project["slug"] for project in browser.json()["results"]] == ["vision"]
    # Without */* nothing but JSON is on offer: DRF refuses, and says so in JSON, not in an HTML page.
    html_only = client.get("/api/v1/projects/", HTTP_ACCEPT="text/html")
    assert html_only["Content-Type"] == "application/json"
    assert html_only.status_code == 406 and html_only.json()["detail"]


@pytest.mark.parametrize("name", STATIC_FILES)
def test_the_portal_s_static_files_are_in_the_manifest(name, db, client):
    # `storage.staticfiles_storage` is looked up only now: imported by name, pytest's collection
    # would set it up before the test session points STATIC_ROOT at its own folder.
    stored = storage.staticfiles_storage.stored_name(name)  # ValueError for a file the manifest lacks
    assert stored != name  # hashed, so that browsers never keep an old copy
    response = client.get(storage.staticfiles_storage.url(name))
    assert response.status_code == 200
    assert b"".join(response.streaming_content).startswith(b"/")  # the comment saying what it is for
