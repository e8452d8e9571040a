"""What each app adds to the site shell: pages, API routes, links, sections of the tenant, project and pool
pages, and e-mail topics.

An app declares one `AppPlugin` as the `plugin` attribute of its AppConfig, naming its modules by dotted
path (nothing is imported while apps load). The shell — `portal/urls.py`, the top bar, the tenant,
project and pool pages, the notification settings — reads every plugin and knows no app by name, so an
app joins the site without editing the shell's templates, URLs or models.

    class BillingConfig(AppConfig):
        plugin = AppPlugin(
            urls="billing.urls",
            api="billing.api.urls",
            nav=(Link(_("Billing"), "billing-home", permission="billing.view_invoice"),),
            email_topics=(EmailTopic("invoices", _("e-mail me new invoices"), _("When one is issued.")),),
        )
"""

from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps
from django.urls import reverse
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class Link:
    """A link to one of the app's pages. With `permission`, only platform staff holding it see the link.
    A tenant tab with `tenant_role` ("viewer", "member", "admin") shows to the tenant's people holding that
    role or a higher one, and also to staff holding `permission` when both are given."""

    label: str
    url_name: str
    permission: str | None = None
    tenant_role: str | None = None

    def visible_to(self, user) -> bool:
        from portal.permissions import staff_may  # AppConfigs import this module before models can load

        if self.permission is None:
            return bool(user and user.is_authenticated)
        return staff_may(user=user, permission=self.permission)

    def visible_in_tenant(self, user, tenant_slug: str) -> bool:
        from portal.permissions import holds_tenant_role, staff_may

        if self.tenant_role is None:
            return self.visible_to(user)
        if holds_tenant_role(user=user, tenant_slug=tenant_slug, role=self.tenant_role):
            return True
        return self.permission is not None and staff_may(user=user, permission=self.permission)


@dataclass(frozen=True)
class EmailTopic:
    """A kind of e-mail the app sends; each person may turn it off on their notification settings."""

    key: str
    label: str
    help_text: str = ""


@dataclass(frozen=True)
class AppPlugin:
    """What one app brings to the shell.

    - `urls`: module whose `urlpatterns` are the app's pages, served from the site root.
    - `api`: module with a `router` (its viewsets) and `urlpatterns` (its other endpoints), under /api/v1/.
    - `nav`: links in the top bar.
    - `tenant_tabs`: links on a tenant's page; their URL takes the tenant's `tenant_slug`.
    - `project_sections`: dotted paths of `section(request, project)`, each returning safe HTML (e.g.
      `render_to_string`), shown in order on a project page; anything else is escaped.
    - `tenant_sections`, `pool_sections`: the same for a tenant's page (`section(request, tenant)`, after
      its projects) and a pool's page (`section(request, pool)`).
    - `email_topics`: the e-mails it sends, each of which a person may turn off.
    """

    urls: str | None = None
    api: str | None = None
    nav: tuple[Link, ...] = ()
    tenant_tabs: tuple[Link, ...] = ()
    project_sections: tuple[str, ...] = ()
    tenant_sections: tuple[str, ...] = ()
    pool_sections: tuple[str, ...] = ()
    email_topics: tuple[EmailTopic, ...] = ()


def plugins() -> list[AppPlugin]:
    """Every installed app's plugin, in INSTALLED_APPS order."""
    return [
        config.plugin
        for config in apps.get_app_configs()
        if isinstance(getattr(config, "plugin", None), AppPlugin)
    ]


@dataclass(frozen=True)
class Shown:
    """A link as a page draws it."""

    label: str
    url: str


def nav_links(user) -> list[Shown]:
    return [
        Shown(link.label, reverse(link.url_name))
        for plugin in plugins()
        for link in plugin.nav
        if link.visible_to(user)
    ]


def tenant_tabs(user, tenant_slug: str) -> list[Shown]:
    return [
        Shown(link.label, reverse(link.url_name, kwargs={"tenant_slug": tenant_slug}))
        for plugin in plugins()
        for link in plugin.tenant_tabs
        if link.visible_in_tenant(user, tenant_slug)
    ]


def project_sections(request, project) -> list[str]:
    paths = [path for plugin in plugins() for path in plugin.project_sections]
    return [import_string(path)(request, project) for path in paths]


def tenant_sections(request, tenant) -> list[str]:
    paths = [path for plugin in plugins() for path in plugin.tenant_sections]
    return [import_string(path)(request, tenant) for path in paths]


def pool_sections(request, pool) -> list[str]:
    paths = [path for plugin in plugins() for path in plugin.pool_sections]
    return [import_string(path)(request, pool) for path in paths]


def email_topics() -> list[EmailTopic]:
    return [topic for plugin in plugins() for topic in plugin.email_topics]
