"""What each app adds to the site shell: pages, API routes, links, sections of the tenant, project and pool
pages, e-mail topics, readiness checks, figures for /metrics, and its periodic tasks and task queues.

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

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
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
    # Dotted path of `count(user) -> int`: a number shown beside the link when above zero (work waiting).
    count: str | None = None

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
class Periodic:
    """A task Celery beat sends on a schedule: `every` is seconds, a callable giving seconds (read when beat
    starts, e.g. from the app's settings), or a `celery.schedules.crontab`."""

    name: str
    task: str
    every: float | Callable[[], float] | Any

    def schedule(self) -> Any:
        return self.every() if callable(self.every) else self.every


@dataclass(frozen=True)
class Route:
    """A task that runs on a queue of its own (a name, or a callable giving it from the app's settings), so
    that its workers can be scaled, and its bursts kept, apart from everything else."""

    task: str
    queue: str | Callable[[], str]

    def queue_name(self) -> str:
        return self.queue() if callable(self.queue) else self.queue


# A queue's name as a worker is told to take it (`--queues`, which splits on commas): no space, no comma.
QUEUE_NAME = re.compile(r"[\w.:@-]+")


def check_queue_settings(settings: Any, *names: str) -> None:
    """Refuse an app's setting that names a Celery queue (`<app>/conf.py`: `*_QUEUE`) when it names none a
    worker could be given, naming the setting: the app's `ready` calls it, so the process stops at start."""
    for name in names:
        value = getattr(settings, name)
        if not isinstance(value, str) or not QUEUE_NAME.fullmatch(value):
            raise ImproperlyConfigured(
                f"{name} must name a Celery queue (letters, digits, '.', ':', '@', '-' or '_'), "
                f"not {value!r}."
            )


@dataclass(frozen=True)
class TenantSetting:
    """A setting an app keeps per tenant, shown and changed through the tenants' API (`PATCH
    /api/v1/tenants/{slug}/`). `kind` is its JSON type (bool, int or str); `read` is the dotted path of
    `read(tenants) -> {tenant id: value}`, for all the tenants at once; `write` of `write(*, actor, tenant,
    value)`, the app's service, which says who may change it and what is valid."""

    name: str
    kind: type
    read: str
    write: str
    help_text: str = ""
    nullable: bool = False  # null is a value of it (e.g. "no limit")


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
    - `approval_sections`: the same for the approver's page of one request (`section(request, tenant)`, the
      tenant asking): what an approver weighs besides capacity, such as what the tenant spends.
    - `capacity_sections`: the same for the operators' capacity pages (`section(request, scope)`, with
      `scope` a `CapacityScope`): what an app knows of the GPUs on screen, such as health and alerts.
    - `tenant_figures`: dotted paths of `figures(user, tenants) -> {tenant id: [Figure, ...]}`, numbers shown
      beside each tenant on the home page, answered for all the tenants at once (no query per tenant).
    - `email_topics`: the e-mails it sends, each of which a person may turn off.
    - `readiness`: dotted paths of `checks() -> [portal.health.Check, ...]`, what `/readyz` reports of the
      app besides the database and Redis (a check `down` takes the process out of service, `degraded` not).
    - `workspaces`: pages where platform staff who belong to no tenant land after signing in, most
      important first, each for the staff holding its `permission` (see `workspace_for`).
    - `metrics`: dotted paths of `collect() -> Iterable[prometheus_client Metric]`, the app's figures on
      `/metrics` (portal/metrics.py serves them, with the processes' own).
    - `periodic_tasks`: what Celery beat sends (`Periodic`); `task_queues`: tasks with a queue of their own.
    - `tenant_settings`: what the app keeps per tenant that the tenants' API shows and changes.
    - `bare_views`: names of URLs whose view serves a hot path by itself, past the site's guards but
      without the rest of the middleware (portal.middleware.BareViewMiddleware): the view's class says
      which requests it serves so, with `serves_bare(request) -> bool`.
    """

    urls: str | None = None
    api: str | None = None
    nav: tuple[Link, ...] = ()
    tenant_tabs: tuple[Link, ...] = ()
    project_sections: tuple[str, ...] = ()
    tenant_sections: tuple[str, ...] = ()
    pool_sections: tuple[str, ...] = ()
    approval_sections: tuple[str, ...] = ()
    capacity_sections: tuple[str, ...] = ()
    tenant_figures: tuple[str, ...] = ()
    email_topics: tuple[EmailTopic, ...] = ()
    workspaces: tuple[Link, ...] = ()
    readiness: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    periodic_tasks: tuple[Periodic, ...] = ()
    task_queues: tuple[Route, ...] = ()
    tenant_settings: tuple[TenantSetting, ...] = ()
    bare_views: tuple[str, ...] = ()


def plugins() -> list[AppPlugin]:
    """Every installed app's plugin, in INSTALLED_APPS order."""
    return [
        config.plugin
        for config in apps.get_app_configs()
        if isinstance(getattr(config, "plugin", None), AppPlugin)
    ]


@dataclass(frozen=True)
class CapacityScope:
    """What a capacity page shows: the whole fleet, one cluster, one group of it, or one node. Ids of
    rows in the pools app; `gpu_ids` are the GPUs drawn on the page (empty above node level);
    `ungrouped` (with a cluster and no group) means the cluster's nodes in no GPU group."""

    cluster_id: int | None = None
    group_id: int | None = None
    node_id: int | None = None
    gpu_ids: tuple[int, ...] = ()
    ungrouped: bool = False


@dataclass(frozen=True)
class Shown:
    """A link as a page draws it."""

    label: str
    url: str
    count: int = 0


def nav_links(user) -> list[Shown]:
    return [
        Shown(link.label, reverse(link.url_name), import_string(link.count)(user) if link.count else 0)
        for plugin in plugins()
        for link in plugin.nav
        if link.visible_to(user)
    ]


def workspace_for(user) -> str | None:
    """The URL of the first workspace the user may open (apps in INSTALLED_APPS order, each app's in its
    order), or None: where staff without a tenant land instead of an empty home page."""
    for plugin in plugins():
        for link in plugin.workspaces:
            if link.permission and link.visible_to(user):
                return reverse(link.url_name)
    return None


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


def approval_sections(request, tenant) -> list[str]:
    paths = [path for plugin in plugins() for path in plugin.approval_sections]
    return [import_string(path)(request, tenant) for path in paths]


def capacity_sections(request, scope: CapacityScope) -> list[str]:
    paths = [path for plugin in plugins() for path in plugin.capacity_sections]
    return [import_string(path)(request, scope) for path in paths]


@dataclass(frozen=True)
class Figure:
    """A number about a tenant at a glance, such as its live pools; `url` is where they are listed."""

    label: str
    value: int
    url: str = ""


def tenant_figures(user, tenants) -> dict[int, list[Figure]]:
    """Every app's figures of each tenant, by tenant id, in the order of INSTALLED_APPS."""
    found: dict[int, list[Figure]] = {tenant.pk: [] for tenant in tenants}
    for path in [path for plugin in plugins() for path in plugin.tenant_figures]:
        for tenant_id, figures in import_string(path)(user, tenants).items():
            found.setdefault(tenant_id, []).extend(figures)
    return found


def readiness_checks() -> list[tuple[str, object]]:
    """Every app's readiness checks, as (dotted path, callable), in the order of INSTALLED_APPS."""
    return [(path, import_string(path)) for plugin in plugins() for path in plugin.readiness]


def email_topics() -> list[EmailTopic]:
    return [topic for plugin in plugins() for topic in plugin.email_topics]


def tenant_settings() -> dict[str, TenantSetting]:
    """Every app's per-tenant settings, by name, in the order of INSTALLED_APPS."""
    return {setting.name: setting for plugin in plugins() for setting in plugin.tenant_settings}


def metric_collectors() -> list[tuple[str, object]]:
    """Every app's figures for /metrics, as (dotted path, callable), in the order of INSTALLED_APPS."""
    return [(path, import_string(path)) for plugin in plugins() for path in plugin.metrics]


def beat_schedule() -> dict[str, dict]:
    """Celery beat's schedule: every app's periodic tasks, by name."""
    return {
        task.name: {"task": task.task, "schedule": task.schedule()}
        for plugin in plugins()
        for task in plugin.periodic_tasks
    }


def task_routes() -> dict[str, dict]:
    """The tasks that run on a queue of their own, as Celery's `task_routes` takes them."""
    return {route.task: {"queue": route.queue_name()} for plugin in plugins() for route in plugin.task_queues}
