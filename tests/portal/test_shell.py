"""The site shell takes each app's pages, API routes, links, project sections and e-mail topics from the
app's plugin, and names no app itself."""

from dataclasses import replace
from importlib import import_module

import pytest
from django.apps import apps
from django.urls import reverse
from django.utils.html import format_html

from portal import shell
from portal.models import Preferences
from tests.factories import PoolFactory
from tests.test_modules import ROOT, imported, project_modules

SHELL_TEMPLATES = ["templates/base.html", "templates/portal/tenant.html", "templates/portal/project.html"]
# The pools page that other apps plug into: it names none of them.
POOL_PAGE = "templates/pools/pool_detail.html"


def test_no_portal_module_imports_an_app():
    known = project_modules()
    reaching = {
        name: sorted(target for target in imported(name, path, known) if not target.startswith("portal"))
        for name, path in known.items()
        if name.startswith("portal.")
    }
    assert {name: targets for name, targets in reaching.items() if targets} == {}


@pytest.mark.parametrize("template", SHELL_TEMPLATES)
def test_the_shell_templates_name_no_app(template):
    text = (ROOT / template).read_text()
    for word in ("capacity-dashboard", "tenant-requests", "tenant-pools", "load i18n pools", "perms.pools"):
        assert word not in text
    for word in ("billing", "invoice", "monitoring"):
        assert word not in text.lower()


def test_the_pool_page_names_no_app_that_plugs_into_it():
    text = (ROOT / POOL_PAGE).read_text()
    for word in ("billing/", "'billing", "tenant-invoices", "monitoring/", "'monitoring"):
        assert word not in text


def test_every_api_route_of_an_app_is_served_and_listed_at_the_root(api_for, tenancy):
    root = api_for(tenancy.acme_member).get("/api/v1/").json()
    for plugin in shell.plugins():
        if plugin.api:
            for prefix, _viewset, basename in import_module(plugin.api).router.registry:
                assert prefix in root
                assert reverse(f"v1:{basename}-list") == f"/api/v1/{prefix}/"
    assert {"tenants", "projects", "pools", "pool-requests"} <= set(root)


def test_a_link_with_a_permission_shows_only_to_staff_holding_it(client_for, tenancy, staff_user):
    capacity = reverse("capacity-dashboard")
    assert capacity not in client_for(tenancy.acme_admin).get("/").content.decode()
    assert capacity in client_for(staff_user("operator")).get("/", follow=True).content.decode()


def test_the_tenant_page_shows_each_apps_tabs(client_for, tenancy):
    page = client_for(tenancy.acme_viewer).get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    assert reverse("tenant-requests", kwargs={"tenant_slug": "acme"}) in page
    assert reverse("tenant-pools", kwargs={"tenant_slug": "acme"}) in page


def test_an_app_added_to_the_shell_shows_on_every_plug_in_point(monkeypatch, client_for, tenancy):
    """A second plugin (as billing will bring) appears without the shell changing."""
    config = apps.get_app_config("pools")
    extra = shell.AppPlugin(
        nav=(shell.Link("Ledger", "api-tokens"),),
        tenant_tabs=(
            shell.Link("Ledger of the tenant", "tenant-pools"),
            shell.Link("Ledger for its admins", "tenant-requests", tenant_role="admin"),
        ),
        project_sections=("tests.portal.test_shell.ledger_section",),
        tenant_sections=("tests.portal.test_shell.tenant_ledger_section",),
        pool_sections=("tests.portal.test_shell.pool_ledger_section",),
        email_topics=(shell.EmailTopic("ledger", "e-mail me the ledger"),),
    )
    monkeypatch.setattr(shell, "plugins", lambda: [config.plugin, extra])
    client = client_for(tenancy.acme_member)

    assert "Ledger</a>" in client.get("/").content.decode()
    tenant_page = client.get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    assert "Ledger of the tenant" in tenant_page
    assert "<p>ledger of tenant acme</p>" in tenant_page
    assert "Ledger for its admins" not in tenant_page  # alice is a member
    assert [tab.label for tab in shell.tenant_tabs(tenancy.acme_admin, "acme")][-1] == "Ledger for its admins"
    pool = PoolFactory(project=tenancy.vision)
    pool_page = client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})).content.decode()
    assert f"<p>ledger of pool {pool.pk}</p>" in pool_page
    assert "Release the pool" in pool_page  # the pools page is still there
    project = client.get(
        reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})
    ).content.decode()
    assert "<p>ledger of vision</p>" in project
    assert "Request GPUs" in project  # the pools section is still there

    settings_page = client.get(reverse("preferences")).content.decode()
    assert "e-mail me the ledger" in settings_page
    assert client.post(reverse("preferences"), {"email_pools": "on"}).status_code == 302
    assert Preferences.wants_email(tenancy.acme_member, "pools")
    assert not Preferences.wants_email(tenancy.acme_member, "ledger")


def ledger_section(request, project) -> str:
    return format_html("<p>ledger of {}</p>", project.slug)


def tenant_ledger_section(request, tenant) -> str:
    return format_html("<p>ledger of tenant {}</p>", tenant.slug)


def pool_ledger_section(request, pool) -> str:
    return format_html("<p>ledger of pool {}</p>", pool.pk)


@pytest.mark.parametrize(
    ("role", "shown"),
    [("viewer", ["acme_viewer", "acme_member", "acme_admin"]), ("member", ["acme_member", "acme_admin"])],
)
def test_a_tab_for_a_tenant_role_shows_to_that_role_and_those_above(role, shown, monkeypatch, tenancy):
    extra = shell.AppPlugin(tenant_tabs=(shell.Link("Ledger", "tenant-pools", tenant_role=role),))
    monkeypatch.setattr(shell, "plugins", lambda: [extra])
    for who in ("acme_viewer", "acme_member", "acme_admin", "globex_member"):
        tabs = shell.tenant_tabs(getattr(tenancy, who), "acme")
        assert [tab.label for tab in tabs] == (["Ledger"] if who in shown else []), who


def test_a_topic_of_an_app_no_longer_installed_stays_as_it_was(monkeypatch, client_for, tenancy):
    Preferences.objects.create(user=tenancy.acme_member, emails_off=["gone"])
    client = client_for(tenancy.acme_member)
    assert client.post(reverse("preferences"), {}).status_code == 302
    # An empty form turns every installed topic off and keeps the unknown one.
    installed = [topic.key for topic in shell.email_topics()]
    assert {"invoices", "pools", "alerts"} <= set(installed)
    turned_off = Preferences.objects.get(user=tenancy.acme_member).emails_off
    assert sorted(turned_off) == sorted(["gone", *installed])


def test_without_topics_the_settings_page_says_so(monkeypatch, client_for, tenancy):
    config = apps.get_app_config("pools")
    monkeypatch.setattr(shell, "plugins", lambda: [replace(config.plugin, email_topics=())])
    page = client_for(tenancy.acme_member).get(reverse("preferences")).content.decode()
    assert "sends no e-mails" in page
